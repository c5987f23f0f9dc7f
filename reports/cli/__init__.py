"""The ``ttft`` command line.

Every command reads or writes files the user names; errors a user can act on (a missing
or corrupt trace, a bad option) print one line naming what was wrong and exit with code 2,
without a traceback. The commands live in ``reports/cli/<command>.py``, one module each; importing
them registers them on :data:`app`.
"""

from __future__ import annotations

import importlib
import pkgutil

from ttft.reports import arrow_pool
from ttft.reports.cli._app import app

__all__ = ["app", "main"]

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if not _module.startswith("_"):  # _app, _options, _progress, __main__ hold no command
        importlib.import_module(f"{__name__}.{_module}")


def main() -> None:
    """Console-script entry point: the process's Arrow pool chosen (``reports.arrow_pool``,
    before any command imports pyarrow), then the command."""
    arrow_pool.choose_for_command()
    app()

