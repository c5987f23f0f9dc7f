"""`Analysis`: what every command reads of a trace, however it was analysed.

One process analysing a table and a Dask cluster merging a dataset's partitions return
this one type (``analysis.part.merge`` makes it in both), equal field for field but for
``assembly``, which only a trace analysed whole in this process keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa

from ttft.analysis.assemble import Assembly
from ttft.analysis.attribution import Attribution
from ttft.analysis.regime import RegimeResult, RegimeSetup
from ttft.analysis.summary import Summary

__all__ = ["Analysis", "ReportRows"]


@dataclass
class ReportRows:
    """A report's per-request rows beyond the attribution: ``blame`` (``analysis.blame``
    of every request), ``prefill_points`` (``analysis.prefill``), both None when only the
    regime was asked for, and ``regime`` (every chunk's ``analysis.regime.regime`` row,
    the peaks in ``attrs["peaks"]``; None without a model shape)."""

    blame: pd.DataFrame | None
    prefill_points: pd.DataFrame | None
    regime: pd.DataFrame | None


@dataclass
class Analysis:
    """One trace analysed at one boundary and policy.

    ``attribution`` holds the per-request parts; ``summary`` what ``ttft analyze --json``
    prints (with its goodput against ``slo``, the limits in ms per metric, when given);
    ``metadata`` the trace's run metadata; ``boundaries`` those some request supports,
    outermost first; ``report`` the report's per-request rows and ``regime`` the regime's
    setup, when the analysis was made for a report or the regime (else None), and
    ``regime_result`` the regime's figures over every chunk (without the per-chunk frame,
    which ``regime.result(report.regime)`` gives where the report rows are kept);
    ``assembly`` the trace
    grouped into requests, every row decoded once, when it was analysed whole in this
    process (None when merged from partitions).
    """

    attribution: Attribution
    summary: Summary
    metadata: dict[str, Any]
    slo: Mapping[str, float] | None = None
    boundaries: tuple[str, ...] = ()
    report: ReportRows | None = None
    regime: RegimeSetup | None = None
    regime_result: RegimeResult | None = None
    assembly: Assembly | None = field(default=None, repr=False)

    @property
    def table(self) -> pa.Table:
        """The span table that was analysed (the analysis must hold its assembly)."""
        if self.assembly is None:
            raise ValueError("an analysis merged from partitions holds no table")
        return self.assembly.rows.table
