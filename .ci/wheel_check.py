"""Import every module of the installed ttft packages; each must come from the given venv.

Usage (the working directory outside the repository, so nothing resolves to the source tree):
    VENV/bin/python .ci/wheel_check.py VENV
Prints one line on success; exits with one line naming what is missing or misplaced otherwise.
"""

from __future__ import annotations

import importlib
import importlib.resources
import pkgutil
import sys
from pathlib import Path

PACKAGES = {
    "ttft.tracer", "ttft.engine", "ttft.engine.disagg", "ttft.engine.server",
    "ttft.collectors", "ttft.collectors.importers", "ttft.analysis", "ttft.reports",
    "ttft.reports.cli", "ttft.reports.runs",
}
DATA = [
    ("ttft.engine", "data/corpus.txt"),
    ("ttft.collectors.importers", "mappings.toml"),
    ("ttft.reports", "assets/plotly-basic.min.js"),
    ("ttft.reports", "assets/plotly-basic.LICENSE"),
]


def cannot_import(name: str) -> None:
    """walk_packages' onerror: without one it silently skips a package that fails to import."""
    raise SystemExit(f"wheel: cannot import {name}: {sys.exc_info()[1]!r}")


def main(venv: Path) -> None:
    ttft = importlib.import_module("ttft")
    walked = pkgutil.walk_packages(ttft.__path__, "ttft.", onerror=cannot_import)
    names = sorted(m.name for m in walked)
    for name in names:
        if name.endswith(".__main__"):  # running it is `python -m`, not an import
            continue
        try:
            module = importlib.import_module(name)
        except Exception:  # any failure is reported the same way
            cannot_import(name)
        if venv not in Path(module.__file__).resolve().parents:
            raise SystemExit(f"wheel: {name} was imported from {module.__file__}, not {venv}")
    if missing := PACKAGES - set(names):
        raise SystemExit(f"wheel: packages missing: {', '.join(sorted(missing))}")
    for package, path in DATA:
        if not importlib.resources.files(package).joinpath(path).is_file():
            raise SystemExit(f"wheel: package data missing: {package} {path}")
    print(f"wheel: {len(names)} modules imported from {venv}; package data present")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
