"""Look at the documentation site in a real browser, with no network.

Builds the site (or takes `--site DIR`), serves it on 127.0.0.1, and opens the home page, the
lifecycle page, the contract page and the reference-worker guide in headless Chromium (Debian's
`chromium`), with every host but 127.0.0.1 unresolvable: a page that needed the network would
show it here. For each page it saves a screenshot and reads back, from the page itself once it
has loaded, the natural width of every image; it fails when a diagram (an image from
docs/diagrams/) did not load or a page shows fewer diagrams than it should.

    scripts/docs_shots.py                      # screenshots in build/docs-shots/
    scripts/docs_shots.py --keep               # also docs/development/contract-page.png

Not part of the test run: it needs Chromium (`apt install chromium`), which CI does not install.
"""

from __future__ import annotations

import argparse
import functools
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO

ROOT = Path(__file__).resolve().parent.parent
#: (page, its URL, the diagrams it must show, the window's height: down to its first diagram;
#: headless Chromium's screenshot of a URL with a #fragment comes out blank)
PAGES = (
    ("home", "", 1, 1500),
    ("lifecycle", "concepts/lifecycle/", 2, 3900),
    ("contract", "reference/contract/", 3, 1500),
    ("reference-worker", "guides/reference-worker/", 1, 4600),
)
KEPT = ROOT / "docs" / "development" / "contract-page.png"
#: Put into each page served: once everything has loaded, the page writes each image's source
#: and natural width into an attribute that Chromium's --dump-dom prints.
PROBE = (
    "<script>addEventListener('load', () => document.body.setAttribute('data-images', JSON.stringify("
    "[...document.images].map(i => [i.getAttribute('src'), i.naturalWidth]))));</script>"
)


class Handler(SimpleHTTPRequestHandler):
    """Serves the site; puts PROBE into every page."""

    def send_head(self) -> io.BytesIO | BinaryIO | None:
        path = Path(self.translate_path(self.path))
        page = path / "index.html" if path.is_dir() else path
        if page.suffix != ".html" or not page.is_file():
            return super().send_head()
        body = page.read_bytes().replace(b"</body>", PROBE.encode() + b"</body>", 1)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    sys.exit("docs_shots: no Chromium here (apt install chromium)")


def browse(browser: str, url: str, *args: str) -> str:
    """Run headless Chromium on `url` with no network: every host but 127.0.0.1 fails to
    resolve, and any other address goes to a proxy that is not there."""
    run = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # run as root in a container
            "--disable-gpu",
            "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--proxy-server=127.0.0.1:9",  # any other address: through a proxy that is not there
            # (Chromium never sends loopback through a proxy)
            "--virtual-time-budget=5000",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if run.returncode != 0:
        sys.exit(f"docs_shots: chromium failed on {url}: {run.stderr[-2000:]}")
    return run.stdout


def images(dom: str) -> list[tuple[str, int]]:
    """(src, natural width) of every image of a page, from its dumped DOM."""
    found = re.search(r'data-images="([^"]*)"', dom)
    if found is None:
        sys.exit("docs_shots: the page did not report its images (it never finished loading)")
    return [(src, int(width)) for src, width in json.loads(html.unescape(found[1]))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", type=Path, help="a built site (default: build it now)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "docs-shots", help="where the screenshots go")
    parser.add_argument(
        "--keep", action="store_true", help=f"also copy the contract page's to {KEPT.relative_to(ROOT)}"
    )
    args = parser.parse_args()
    browser = chromium()
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site
        if site is None:
            site = Path(tmp) / "site"
            mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)]
            subprocess.run(mkdocs, cwd=ROOT, check=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
        server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(site)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        args.out.mkdir(parents=True, exist_ok=True)
        failed = False
        try:
            for name, path, want, height in PAGES:
                shot = args.out / f"{name}.png"
                browse(browser, base + path, f"--screenshot={shot}", f"--window-size=1280,{height}")
                loaded = images(browse(browser, base + path, "--dump-dom"))
                drawn = [(src, width) for src, width in loaded if "diagrams/" in src]
                ok = len(drawn) >= want and all(width > 0 for _, width in drawn)
                failed |= not ok
                shown = ", ".join(f"{src.rsplit('/', 1)[-1]} {width} px" for src, width in drawn) or "none"
                print(f"{'ok  ' if ok else 'FAIL'} {name:17} diagrams: {shown} (want {want}); {shot}")
        finally:
            server.shutdown()
    if args.keep and not failed:
        shutil.copy(args.out / "contract.png", KEPT)
        print(f"kept {KEPT}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
