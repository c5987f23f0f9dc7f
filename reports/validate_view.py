"""``ttft validate`` in the terminal: injected against recovered delay per stage."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ttft.reports._text import plain
from ttft.reports.runs.validate import StageCheck, ValidateResult
from ttft.reports.terminal import FittedTable


def _row(check: StageCheck, *, informational: bool = False) -> list[str | Text]:
    mark = Text("✓", style="green") if check.ok else Text("✗", style="red")
    if informational and not check.ok:
        mark = Text("~", style="yellow")
    return [
        plain(check.stage),
        f"{check.injected_ms:.1f}",
        f"{check.recovered_ms:.2f}",
        f"{check.error_ms:+.2f}",
        f"±{check.tolerance_ms:.2f}",
        f"{check.baseline_median_ms:.2f}",
        f"{check.injected_median_ms:.2f}",
        mark,
    ]


# The headers where the table is too wide for them: at 80 columns.
_SHORT = {"injected": "inj.", "recovered": "recov.", "tolerance": "tol.", "baseline": "base",
          "delayed": "delay"}  # fmt: skip


def render_validate(result: ValidateResult) -> Table:
    """The injected-vs-recovered table (ms), the informational TTFT row last; it fits the
    width it is printed in (:class:`~ttft.reports.terminal.FittedTable`)."""
    table = FittedTable(
        title=f"injected vs recovered at the server boundary (median ms, exclusive; "
        f"{result.injected.windows} requests)",
        title_justify="left",
        short=_SHORT,
    )
    for name in ("stage", "injected", "recovered", "error", "tolerance", "baseline", "delayed"):
        table.add_column(name, justify="left" if name == "stage" else "right")
    table.add_column("ok", justify="center")
    for check in result.stages:
        table.add_row(*_row(check))
    table.add_section()
    table.add_row(*_row(result.ttft, informational=True))
    return table
