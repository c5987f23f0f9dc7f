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
