"""The site shows pictures, never Mermaid: an MkDocs hook (mkdocs.yml).

spec/CONTRACT.md keeps its state graphs as Mermaid for GitHub, which renders it, each block
marked `<!-- diagram: NAME: TITLE -->` by `devbridge docs` (scripts/docs.py, `picture`), which
also draws docs/diagrams/NAME.svg from the same spec. On the site each marked block becomes that
picture. Material for MkDocs fetches Mermaid from a CDN for any page that holds a Mermaid block,
so a block with no picture fails the build instead: the site must read the same with no network.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.pages import Page
from mkdocs.utils import get_relative_url

#: The pictures, in the site's docs folder (set from the config when MkDocs runs the hook).
DIAGRAMS = Path(__file__).resolve().parent.parent / "docs" / "diagrams"
#: A Mermaid block as pymdownx.superfences' `fence_code_format` writes it, after its mark.
MARKED = re.compile(r'<!-- diagram: ([\w-]+): (.*?) -->\s*<pre class="mermaid"><code>.*?</code></pre>', re.S)
#: Any element left with the class the theme loads Mermaid for, however its attribute is quoted.
MERMAID = re.compile(r"""class\s*=\s*["']?[^"'>]*\bmermaid\b""", re.I)


def pictures(page_html: str, page_url: str) -> str:
    """`page_html` with each marked Mermaid block replaced by its picture (a link relative to
    `page_url`); PluginError for a picture that is not drawn or a Mermaid block left."""

    def picture(match: re.Match[str]) -> str:
        name = match[1]
        if not (DIAGRAMS / f"{name}.svg").is_file():
            raise PluginError(f"{page_url}: no docs/diagrams/{name}.svg for its diagram (run `devbridge docs`)")
        src = get_relative_url(f"diagrams/{name}.svg", page_url)
        return f'<p class="diagram"><img src="{src}" alt="{html.escape(match[2])}"></p>'

    out = MARKED.sub(picture, page_html)
    if MERMAID.search(out):
        raise PluginError(
            f"{page_url}: a Mermaid block with no picture (the theme would fetch Mermaid from a CDN): "
            "draw it with `devbridge docs` and mark it, or show an image"
        )
    return out


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    global DIAGRAMS
    DIAGRAMS = Path(config.docs_dir) / "diagrams"
    return config


def on_page_content(html: str, page: Page, **kwargs: object) -> str:
    return pictures(html, page.url)
