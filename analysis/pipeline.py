"""The one analysis every command runs: ``analyze(table)`` is
``merge([analyze_part(table)])`` (``analysis.part``).

``ttft analyze``, ``report``, ``compare``, ``trace``, ``join``, ``demo`` and ``validate``
all come through ``analysis.part``, here for a table in memory, through
``ttft.reports.runs.analyses`` for a location in this process or on a Dask cluster, so one
file gives one answer whichever command reads it. Pure (no I/O): the table comes from
:func:`ttft.collectors.read_spans`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from ttft.analysis.part import ReportInputs, analyze_part, merge
from ttft.analysis.regime import regime_setup
from ttft.analysis.result import Analysis
from ttft.tracer.schema import read_inputs, run_metadata

__all__ = ["Analysis", "analyze"]


def analyze(
    table: pa.Table,
    *,
    boundary: str | None = None,
    policy: str = "exclusive",
    trace: str = "",
    slo: Mapping[str, float] | None = None,
    regime: Mapping[str, Any] | None = None,
) -> Analysis:
    """Assemble, attribute and summarize a span table: ``merge([analyze_part(table)])``,
    the assembly kept.

    Args:
        table: spans with ``SPAN_SCHEMA`` (from ``read_spans``), run metadata in its schema.
        boundary: ``client``, ``server`` or ``engine``; None for the outermost boundary at
            least one request supports.
        policy: ``exclusive``, ``shared`` or ``critical-path``.
        trace: the trace's path, echoed in the summary.
        slo: a limit in ms per metric (``ttft``, ``tpot``, ``itl``, ``e2e``) for the
            summary's goodput; None (or empty) for none.
        regime: for a report, ``regime_setup``'s keyword arguments (``{}`` for the trace's
            own model and device): the analysis then holds the report's per-request rows.

    Raises:
        ValueError: an unknown boundary or policy, an unknown SLO metric or a limit that
            is not positive, or a model config that is not a model shape.
    """
    metadata = run_metadata(table)
    setup = None if regime is None else regime_setup(table, metadata, **regime)
    report = None if setup is None else ReportInputs(None, setup)
    part = analyze_part(table, boundary=boundary, policy=policy, report=report, keep=True)
    return merge([part], metadata=metadata, trace=trace, slo=slo, inputs=read_inputs(table),
                 regime=setup)
