"""Open pages in the system's headless Chromium through Playwright (no browser download).

The browser is Debian's ``chromium`` (README prerequisites; ``.ci/run`` installs it when
missing), or the one named by ``TTFT_CHROMIUM``. Without one the browser tests skip, except
under CI, where a missing browser is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


def chromium_path() -> str:
    """The Chromium executable to drive; skips (fails under CI) when there is none."""
    path = os.environ.get("TTFT_CHROMIUM") or shutil.which("chromium") or shutil.which(
        "chromium-browser"
    )
    if path is None:
        message = "no chromium on PATH (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    pytest.importorskip("playwright.sync_api")
    return path


@contextlib.contextmanager
def page(width: int = 1280, height: int = 900) -> Iterator:
    """A fresh page in headless Chromium, closed afterwards."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def open_offline(pg, path: Path) -> tuple[list[str], list[str]]:
    """Load ``path`` with every non-file request refused; returns ``(console errors and
    page errors, refused URLs)`` collected until the page settled."""
    errors: list[str] = []
    refused: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))

    def route(r):
        if r.request.url.startswith(("file:", "data:", "blob:")):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()

    pg.route("**/*", route)
    pg.goto(path.resolve().as_uri(), wait_until="load")
    pg.wait_for_timeout(300)
    return errors, refused


# Where a page's plotly figures put their text: boxes relative to each figure's SVG.
LAYOUT = """() => [...document.querySelectorAll('.js-plotly-plot')].map(d => {
    const svg = d.querySelector('svg.main-svg').getBoundingClientRect();
    const box = e => {
        const r = e.getBoundingClientRect();
        return [r.left - svg.left, r.top - svg.top, r.right - svg.left, r.bottom - svg.top];
    };
    const all = sel => [...d.querySelectorAll(sel)].filter(e => e.textContent).map(box);
    return {
        id: d.id, width: svg.width, height: svg.height,
        titles: all('.gtitle, .gtitle-subtitle, .g-xtitle text, .g-ytitle text'),
        marks: all('g.trace.scatter .textpoint'),
        ticks: [...d.querySelectorAll('.xtick text, .xtick2 text')].filter(
            e => e.textContent).map(e => [e.textContent, ...box(e)]),
        labels: all('.annotation'),
        legend: [...d.querySelectorAll('.legend .bg')].map(box),
        xtitle: all('.g-xtitle text'),
    };
})"""


def within(box, d) -> bool:
    """Whether ``box`` (a `LAYOUT` box) lies inside figure ``d``'s SVG."""
    left, top, right, bottom = box
    return (
        left >= -0.5 and top >= -0.5 and right <= d["width"] + 0.5 and bottom <= d["height"] + 0.5
    )


def _overlap(a, b) -> bool:
    return a[0] < b[2] - 0.5 and b[0] < a[2] - 0.5 and a[1] < b[3] - 0.5 and b[1] < a[3] - 0.5


def overlapping(boxes) -> list:
    """The pairs of ``boxes`` that overlap (by more than half a pixel)."""
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if _overlap(a, b)]
