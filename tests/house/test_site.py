"""The documentation site reads the same with no network: nothing in the built site is fetched
from another host at page load, and no page holds a Mermaid block (the theme would fetch
Mermaid from a CDN for it); the state graphs are pictures drawn from the spec."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mkdocs.exceptions import PluginError

from devbridge.checkout import script

ROOT = Path(__file__).resolve().parents[2]
SITE_DIAGRAMS = script("site_diagrams")

#: What a page fetches as it loads: scripts, frames and media (`src`, `poster`, `srcset`),
#: stylesheets, icons and preconnects (`<link href>`), SVG images (`<image href>`), objects
#: (`data`), and what CSS imports or points at.
ATTRIBUTE = r"""\s*=\s*["']?([^"'\s>]+)"""
FETCHED = (
    re.compile(r"<(?:script|img|iframe|frame|source|embed|video|audio|track|input)\b[^>]*?\bsrc" + ATTRIBUTE, re.I),
    re.compile(r"<\w+\b[^>]*?\bposter" + ATTRIBUTE, re.I),
    re.compile(r"<link\b[^>]*?\bhref" + ATTRIBUTE, re.I),
    re.compile(r"<(?:image|use|feImage)\b[^>]*?\b(?:xlink:)?href" + ATTRIBUTE, re.I),
    re.compile(r"<object\b[^>]*?\bdata" + ATTRIBUTE, re.I),
    re.compile(r"url\(\s*[\"']?([^\"')\s]+)", re.I),
    re.compile(r"@import\s+[\"']([^\"']+)", re.I),
)
SRCSET = re.compile(r"""\bsrcset\s*=\s*["']([^"']+)["']""", re.I)
OUTSIDE = re.compile(r"^\s*(https?:)?//(?!(127\.0\.0\.1|localhost)[:/])", re.I)


def outside_hosts(site: Path) -> list[str]:
    """'file: url' for everything the built site would fetch from another host."""
    found = []
    for path in sorted(site.rglob("*")):
        if path.suffix not in (".html", ".css", ".svg"):
            continue
        text = path.read_text(errors="replace")
        urls = [url for pattern in FETCHED for url in pattern.findall(text)]
        urls += [item.split()[0] for srcset in SRCSET.findall(text) for item in srcset.split(",") if item.strip()]
        found += [f"{path.relative_to(site)}: {url}" for url in urls if OUTSIDE.match(url)]
    return found


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f", str(config), "-d", str(site)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_built_site_fetches_nothing_from_another_host_and_a_cdn_script_added_back_is_caught(tmp_path: Path) -> None:
    """One test, two builds in turn (the build lays the package out under build/ first)."""
    site = tmp_path / "site"
    run = build(ROOT / "mkdocs.yml", site)
    assert run.returncode == 0, run.stderr
    assert outside_hosts(site) == []
    pages = {p.relative_to(site).as_posix(): p.read_text() for p in site.rglob("*.html")}
    assert not [p for p, text in pages.items() if re.search(r'class="[^"]*\bmermaid\b', text)]
    contract = pages["reference/contract/index.html"]
    shown = [(src, html.unescape(alt)) for src, alt in re.findall(r'<img src="([^"]+)" alt="([^"]+)">', contract)]
    assert shown == [
        ("../../diagrams/lifecycle.svg", "The lifecycle at a glance"),
        ("../../diagrams/lifecycle-full.svg", "The lifecycle in full"),
        ("../../diagrams/ring-records.svg", "A ring reservation's record"),
    ]
    for src, _ in shown:
        assert (site / "reference" / "contract" / src).resolve().read_text().lstrip().startswith("<?xml")
    assert 'src="../../diagrams/lifecycle.svg"' in pages["concepts/lifecycle/index.html"]
    assert 'src="../../diagrams/worker-stages.svg"' in pages["guides/reference-worker/index.html"]

    # the same site with Mermaid's CDN script and a web font added back: the check names both
    config = tmp_path / "mkdocs.yml"  # its paths made absolute: they are relative to its folder
    text = (ROOT / "mkdocs.yml").read_text().replace("  font: false", "  font:\n    text: Roboto")
    text = text.replace("docs_dir: docs", f"docs_dir: {ROOT / 'docs'}").replace("  - scripts/", f"  - {ROOT}/scripts/")
    text = text.replace("paths: [build/docs-package]", f"paths: [{ROOT / 'build' / 'docs-package'}]")
    config.write_text(text + "\nextra_javascript:\n  - https://unpkg.com/mermaid@11/dist/mermaid.min.js\n")
    run = build(config, tmp_path / "cdn")
    assert run.returncode == 0, run.stderr
    hosts = {
        url.split("//", 1)[1].split("/", 1)[0] for url in (f.split(": ", 1)[1] for f in outside_hosts(tmp_path / "cdn"))
    }
    assert hosts == {"unpkg.com", "fonts.googleapis.com", "fonts.gstatic.com"}


@pytest.mark.parametrize(
    "fetch",
    [
        '<script src="https://unpkg.com/mermaid@11/dist/mermaid.min.js"></script>',
        "<link rel=stylesheet href=//cdn.example.org/x.css>",
        "<style>body { background: url('https://example.org/bg.png') }</style>",
        '<style>@import "https://fonts.example.org/f.css";</style>',
        '<img src="http://example.org/diagram.svg">',
        '<IMG SRC="HTTPS://EXAMPLE.ORG/D.SVG">',
        '<img srcset="pic.png 1x, https://cdn.example.org/pic@2x.png 2x">',
        '<svg><image href="https://example.org/i.png"/></svg>',
        '<svg><use xlink:href="//example.org/sprite.svg#x"/></svg>',
        '<object data="https://example.org/d.svg"></object>',
        '<video poster="https://example.org/p.png"></video>',
    ],
)
def test_each_way_a_page_fetches_from_another_host_is_caught(tmp_path: Path, fetch: str) -> None:
    (tmp_path / "index.html").write_text(f"<html><head></head><body>{fetch}</body></html>")
    (tmp_path / "ok.html").write_text(
        '<a href="https://example.org/">a link is not fetched</a><img src="diagrams/x.svg">'
        '<script src="http://127.0.0.1:8000/local.js"></script>'
    )
    assert [f.split(": ", 1)[0] for f in outside_hosts(tmp_path)] == ["index.html"]


MERMAID = '<pre class="mermaid"><code>stateDiagram-v2\n    [*] --&gt; a</code></pre>'


def test_a_marked_mermaid_block_becomes_its_picture_relative_to_the_page() -> None:
    page = f"<p>x</p>\n<!-- diagram: lifecycle: The lifecycle at a glance -->\n{MERMAID}\n<p>y</p>"
    out = SITE_DIAGRAMS.pictures(page, "reference/contract/")
    picture = '<p class="diagram"><img src="../../diagrams/lifecycle.svg" alt="The lifecycle at a glance"></p>'
    assert out == f"<p>x</p>\n{picture}\n<p>y</p>"
    at_root = SITE_DIAGRAMS.pictures(page, "").split("\n")[1]
    assert at_root.startswith('<p class="diagram"><img src="diagrams/lifecycle.svg"')


def test_a_mermaid_block_with_no_picture_fails_the_build() -> None:
    with pytest.raises(PluginError, match=r"^guides/x/: a Mermaid block with no picture"):
        SITE_DIAGRAMS.pictures(f"<p>x</p>{MERMAID}", "guides/x/")
    with pytest.raises(PluginError, match=r"no docs/diagrams/nothing\.svg for its diagram"):
        SITE_DIAGRAMS.pictures(f"<!-- diagram: nothing: Nothing -->\n{MERMAID}", "guides/x/")
    for left in ('<div class="language-mermaid highlight">', "<pre class='mermaid'>", "<pre class=mermaid>"):
        with pytest.raises(PluginError, match="a Mermaid block with no picture"):
            SITE_DIAGRAMS.pictures(f"{left}graph TD</pre>", "guides/x/")
