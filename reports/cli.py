"""The ``ttft`` command line.

Every command reads or writes files the user names; errors a user can act on (a missing
or corrupt trace, a bad option) print one line naming what was wrong and exit with code 2,
without a traceback. The commands live in ``reports/cmd_*.py``; importing them registers
them on :data:`app`.
"""

from __future__ import annotations

import importlib
import pkgutil

import ttft.reports as _reports
from ttft.reports._app import app

__all__ = ["app", "main"]

for _module in sorted(m.name for m in pkgutil.iter_modules(_reports.__path__)):
    if _module.startswith("cmd_"):
        importlib.import_module(f"ttft.reports.{_module}")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
