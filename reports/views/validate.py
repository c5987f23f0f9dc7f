"""``ttft validate`` in the terminal: injected against recovered delay per stage, and the
preemption case."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ttft.reports._text import plain
from ttft.reports.runs.validate import StageCheck, ValidateResult
from ttft.reports.runs.validate_preemption import PreemptionCheck
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


def _mark(ok: bool) -> Text:
    return Text("✓", style="green") if ok else Text("✗", style="red")


def render_preemption(check: PreemptionCheck) -> Table:
    """One row per request preempted before its first token: its ``preempted`` time in
    TTFT, the part of it blame gives to other requests' prefill and decode, and the
    requests that took its blocks; a row saying so when none was preempted."""
    table = FittedTable(
        title=f"preemption: {check.requests} requests, {check.num_blocks} K/V blocks, "
        f"recompute ({check.preemptions} preemption{'' if check.preemptions == 1 else 's'}; "
        f"at the server boundary, exclusive)",
        title_justify="left",
        short={"in TTFT ms": "TTFT", "blamed ms": "blamed"},
    )
    for name in ("request", "in TTFT ms", "blamed ms", "blocks taken by"):
        table.add_column(name, justify="right" if name.endswith("ms") else "left")
    table.add_column("ok", justify="center")
    for req in check.before_first_token:
        table.add_row(plain(req.request_id), f"{req.preempted_ms:.2f}", f"{req.blamed_ms:.2f}",
                      plain(", ".join(req.taken_by) or "(not named)"), _mark(req.ok))
    if not check.before_first_token:
        table.add_row("(none preempted before its first token)", "", "", "", _mark(False))
    return table
