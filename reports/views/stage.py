"""The stage tables of ``ttft analyze`` and ``ttft report`` in the terminal: a row per
stage with its share of TTFT and its attributed time, fitted to the console, and below
them the notes that explain what is shown, and only that: a column left out at this
width loses its note (and is named as left out), a stage with no attributed time in any
request of a table loses its row (and is named, with the reason, once)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ttft.reports._text import UNTRACED_NOTE, plain
from ttft.reports.table_fit import allot, fit
from ttft.tracer.schema import ROOT_ONLY_STAGE, root_only_stage

__all__ = ["ANALYZE_DROP", "RAW_DROP", "StageBlock", "stage_table"]

_BAR_WIDTH = 20
_NARROW_BAR_WIDTH = 10
# header -> the key of a ``Summary.stages`` row it shows
_COLUMNS = {"p50 ms": "p50", "p90 ms": "p90", "p99 ms": "p99", "mean ms": "mean",
            "raw mean ms": "raw_mean", "overlap ms": "overlap_mean"}
ANALYZE_DROP = ("raw mean ms", "overlap ms", "p90 ms")
"""``ttft analyze``'s order of leaving columns out while a table is too wide: its
percentiles stay (stage, share, p50, p99 and mean fit 80 columns)."""
RAW_DROP = ("p90 ms", "p99 ms", "p50 ms")
"""The order for a table about raw durations against attributed time: its mean, raw mean
and overlap stay (with stage, share and p50 they fit 80 columns)."""


def _bar(share: float, bar_width: int) -> Text:
    filled = max(0, min(bar_width, round(share * bar_width)))
    bar = Text("█" * filled + "·" * (bar_width - filled), style="cyan")
    bar.append(f" {share:6.1%}")
    return bar


def shown(stages: dict[str, dict]) -> dict[str, dict]:
    """The rows of ``stages`` (``Summary.stages``) a terminal table shows: those with
    attributed time in some request (a mean above 0; times are whole ns, never negative),
    largest share first."""
    rows = [(stage, row) for stage, row in stages.items() if row["mean"] > 0]
    return dict(sorted(rows, key=lambda kv: -kv[1]["share"]))


def stage_table(title: str, ttft_ms: dict[str, float] | None, stages: dict[str, dict],
                console: Console, drop: Sequence[str] = ANALYZE_DROP) -> Table:
    """One table of the `shown` rows of ``stages``, TTFT percentiles in the caption,
    fitted to ``console.width``: the columns ``drop`` names left out in that order, the
    share bar narrowed from 20 to 10 characters before the last of them goes. ``title``
    and the stage names are shown as plain text."""
    table = fit(_stage_table(title, ttft_ms, stages, _BAR_WIDTH), console, drop[:-1])
    if allot(table, console):
        return table
    return fit(_stage_table(title, ttft_ms, stages, _NARROW_BAR_WIDTH), console, drop)


def _stage_table(
    title: str, ttft_ms: dict[str, float] | None, stages: dict[str, dict], bar_width: int
) -> Table:
    caption = ("TTFT  none: no request that did not fail has a window at this boundary"
               if ttft_ms is None else
               "TTFT  " + "  ".join(f"{k} {v:,.2f} ms" for k, v in ttft_ms.items()))
    table = Table(
        title=plain(title, "table.title"),
        caption=caption,
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("stage", no_wrap=True)
    table.add_column("share of TTFT", no_wrap=True)
    for name in _COLUMNS:
        table.add_column(name, justify="right")
    for stage, row in shown(stages).items():
        table.add_row(plain(stage), _bar(row["share"], bar_width),
                      *(f"{row[key]:,.2f}" for key in _COLUMNS.values()))
    return table


@dataclass
class StageBlock:
    """Stage tables printed together (all requests, then one per condition) and the notes
    under them, fitted to ``console``; ``boundary`` and ``policy`` are the analysis's,
    for the reasons a stage has no time."""

    console: Console
    boundary: str
    policy: str
    drop: Sequence[str] = ANALYZE_DROP
    tables: list[Table] = field(default_factory=list)
    # stage -> the scopes ("" for all requests, else a condition) where it has no time
    _zero: dict[str, list[str]] = field(default_factory=dict)
    _raw_ms: dict[str, float] = field(default_factory=dict)
    _median_zero: dict[str, dict] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)
    _untraced: bool = False

    def add(self, title: str, ttft_ms: dict[str, float] | None, stages: dict[str, dict],
            scope: str = "") -> None:
        """A table of ``stages`` (``Summary.stages`` or a condition's) titled ``title``;
        ``scope`` names its requests in the notes (``""``: all of them)."""
        self.tables.append(stage_table(title, ttft_ms, stages, self.console, self.drop))
        self._seen.update(stages)
        self._untraced |= stages.get("untraced", {}).get("mean", 0) > 0
        for stage, row in stages.items():
            if row["mean"] == 0:
                self._zero.setdefault(stage, []).append(scope)
                self._raw_ms.setdefault(stage, row["raw_mean"])
            elif row["p50"] == 0:
                self._median_zero.setdefault(stage, row)

    def render(self) -> Group:
        """The tables, then the notes: the left-out rows, the p50 of 0 under a larger
        mean, what the columns shown mean and which were left out at this width."""
        headers = {c.header for table in self.tables for c in table.columns}
        notes = [UNTRACED_NOTE if self._untraced else "", self._left_out(),
                 self._median_note(headers), self._column_note(headers)]
        return Group(*self.tables, *(Text(n, style="dim") for n in notes if n))

    def _left_out(self) -> str:
        if not self._zero:
            return ""
        parts = []
        for stage, scopes in self._zero.items():
            where = "" if "" in scopes else " among " + ", ".join(scopes)
            parts.append(f"{stage}{where} ({self._why_zero(stage)})")
        return "not shown, 0 ms in every request: " + "; ".join(parts) + "."

    def _why_zero(self, stage: str) -> str:
        own = ROOT_ONLY_STAGE.get(self.boundary)
        if stage == self.boundary and own not in (None, stage):
            blind = root_only_stage(self.boundary, server_window=False)
            if blind != own and blind in self._seen:
                own += f", or {blind} for a request without a server window"
            return f"the window's root: its time is its inner spans' and, where none runs, {own}"
        over = "ranked above it" if self.policy == "exclusive" else "inside it"
        raw = self._raw_ms[stage]
        return f"its spans' {raw:,.2f} ms raw mean is all covered by spans {over}"

    def _median_note(self, headers: set) -> str:
        if not self._median_zero or "p50 ms" not in headers:
            return ""
        names = ", ".join(self._median_zero)
        text = (f"p50 0.00 under a larger mean ({names}): at least half the requests have "
                "none of that stage's time, the rest carry its mean")
        covered = [s for s, row in self._median_zero.items() if row["overlap_mean"] > 0]
        if covered:
            keeps, its = ("keep", "their") if len(covered) > 1 else ("keeps", "its")
            text += (f"; {', '.join(covered)} {keeps} only the part of {its} spans no span "
                     "over it covers, none where they cover all of it")
        return text + "."

    def _column_note(self, headers: set) -> str:
        notes = ["share: the stage's attributed time over all TTFT"]
        if "raw mean ms" in headers:
            notes.append("raw: its spans' durations clipped to the window")
        if "overlap ms" in headers:
            raw = "raw" if "raw mean ms" in headers else "its spans' clipped durations"
            notes.append(f"overlap = {raw} - attributed, the double counting that adding "
                         "durations would do")
        text = "; ".join(notes) + "."
        left = [h for h in _COLUMNS if h not in headers]
        if left and self.tables:
            text += (f" Left out at this width: {', '.join(left)} (a wider terminal shows "
                     "them, as does ttft analyze --json).")
        return text
