"""Take the README's screenshot of a report: the top of the page (headline and stage
stacks, down to the stage chart's bottom edge) in headless Chromium, as a PNG.

    ttft synth -o /tmp/s.parquet --requests 400 && ttft report /tmp/s.parquet -o /tmp/r.html
    python docs/screenshot.py /tmp/r.html docs/report.png

Needs Playwright (``pip install -e '.[dev]'``) and Debian's ``chromium`` (or set
``TTFT_CHROMIUM`` to a Chromium executable).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

MAX_BYTES = 300_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="an HTML report written by ttft report -o")
    parser.add_argument("out", type=Path, help="PNG to write")
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument(
        "--height", type=int, help="pixels from the page top (default: to the stage chart's end)"
    )
    args = parser.parse_args()
    chromium = os.environ.get("TTFT_CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        sys.exit("no chromium on PATH (apt-get install -y chromium) and TTFT_CHROMIUM unset")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": 900})
        page.goto(args.report.resolve().as_uri(), wait_until="load")
        page.wait_for_timeout(500)
        height = args.height or page.evaluate(
            "() => document.getElementById('stage-bars').closest('.panel')"
            ".getBoundingClientRect().bottom + 12"
        )
        clip = {"x": 0, "y": 0, "width": args.width, "height": height}
        page.screenshot(path=str(args.out), clip=clip, full_page=True)
        browser.close()
    size = args.out.stat().st_size
    print(f"wrote {args.out}: {size / 1000:.0f} kB")
    if size > MAX_BYTES:
        print(f"over the README's {MAX_BYTES / 1000:.0f} kB budget: lower --height or --width")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
