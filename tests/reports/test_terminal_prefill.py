"""The terminal report's prefill table shows a fit only where it explains the data, and
reads it only inside the token counts measured (as the HTML report draws it)."""

from __future__ import annotations

import dataclasses

import pandas as pd
from rich.console import Console

from ttft.analysis.prefill import QuadraticFit
from ttft.reports.terminal_report import _prefill


@dataclasses.dataclass
class _Data:  # the two fields `_prefill` reads of a ReportData
    prefill_fits: dict[str, QuadraticFit]
    prefill_points: pd.DataFrame


def _render(fits: dict[str, QuadraticFit], points: pd.DataFrame) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(_prefill(_Data(fits, points)))
    return console.export_text()


def _row(text: str, cond: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"│ {cond} "))
    return [cell.strip() for cell in line.strip("│").split("│")]


def test_a_fit_is_shown_only_where_it_explains_the_data_and_never_extrapolated():
    points = pd.DataFrame({
        "condition": ["cold"] * 3 + ["prefix_hit"] * 3,
        "computed_tokens": [100, 600, 1000, 50, 3000, 4000],
    })
    good = QuadraticFit(a_ns=2e6, b_ns_per_token=1e4, c_ns_per_token2=1.0, r2=0.95, points=3)
    poor = dataclasses.replace(good, r2=0.5)
    text = _render({"cold": good, "prefix_hit": poor}, points)
    cold = _row(text, "cold")
    # a ms, b µs/token, c, R², at 512 (inside 100–1,000), at 2048 (outside: not read)
    assert cold[1:8] == ["3", "100–1,000", "2.000", "10.000", "1.0000", "0.950", "7.38"]
    assert cold[8] == "—"
    hit = _row(text, "prefix_hit")
    assert hit[2:6] == ["50–4,000", "—", "—", "—"] and hit[6] == "0.500"
    assert hit[7:] == ["—", "—"]
