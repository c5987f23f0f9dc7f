"""The ``ttft`` Typer application and what every command shares: the error line, the
spinner, the boundary and policy choices.

Commands live in ``reports/cmd_*.py`` modules; each decorates its functions with
``@app.command()`` and :mod:`ttft.reports.cli` imports them all, so adding a command never
means editing a shared file.
"""

from __future__ import annotations

from contextlib import contextmanager
from enum import Enum
from typing import Annotated

import typer
from rich.console import Console

from ttft.tracer.schema import BOUNDARY_NAMES, POLICIES

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="ttft: where did the time to first token go? Trace, attribute, report.",
    rich_markup_mode=None,
)
err = Console(stderr=True, highlight=False)

BoundaryName = Enum("BoundaryName", {b: b for b in BOUNDARY_NAMES}, type=str)  # type: ignore[misc]
PolicyName = Enum("PolicyName", {p: p for p in POLICIES}, type=str)  # type: ignore[misc]
BoundaryOption = Annotated[
    BoundaryName | None,
    typer.Option(help="TTFT boundary (default: the outermost the trace supports)"),
]
PolicyOption = Annotated[PolicyName, typer.Option(help="how overlapping spans share a segment")]


def fail(message: str) -> typer.Exit:
    """Print one error line and return the exit (code 2) to raise."""
    err.print(f"[bold red]error:[/bold red] {message}", soft_wrap=True)
    return typer.Exit(code=2)


@contextmanager
def progress(message: str):
    """A spinner on stderr while ``message`` runs (only on a terminal)."""
    if err.is_terminal:
        with err.status(message):
            yield
    else:
        yield


def stdout_console() -> Console:
    """A console for results on stdout (140 columns when not a terminal)."""
    import sys

    return Console(highlight=False, width=None if sys.stdout.isatty() else 140)
