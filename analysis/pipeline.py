"""The one analysis every command runs: assemble → attribute → summarize.

:func:`analyze` is the only place the pipeline is spelled out; ``ttft analyze``, ``report``,
``compare``, ``trace``, ``join``, ``demo`` and ``validate`` all call it, so one file gives one
answer whichever command reads it. Pure (no I/O): the table comes from
:func:`ttft.collectors.read_spans`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ttft.analysis.assemble import Assembly, assemble
from ttft.analysis.attribution import Attribution, attribute
from ttft.analysis.summary import Summary, summarize
from ttft.tracer.schema import INPUTS_KEY, METADATA_KEY, SCHEMA_VERSION

__all__ = ["Analysis", "analyze"]


@dataclass
class Analysis:
    """One trace analysed at one boundary and policy.

    ``assembly`` is the trace grouped into requests (with every row decoded once, for blame,
    prefill scaling, regime and waterfalls); ``attribution`` the per-request parts;
    ``summary`` what ``ttft analyze --json`` prints (with its goodput against ``slo``, the
    limits in ms per metric, when given); ``metadata`` the trace's run metadata.
    """

    assembly: Assembly
    attribution: Attribution
    summary: Summary
    metadata: dict[str, Any]
    slo: Mapping[str, float] | None = None

    @property
    def table(self) -> pa.Table:
        """The span table that was analysed."""
        return self.assembly.rows.table

    def at(self, boundary: str | None = None, policy: str | None = None) -> Analysis:
        """The same trace at another boundary or policy (the assembly and the SLOs are
        reused).

        Raises:
            ValueError: an unknown boundary or policy.
        """
        attr = attribute(self.assembly, boundary, policy or self.attribution.policy)
        summary = summarize(
            attr,
            self.assembly,
            trace=self.summary.trace,
            schema_version=self.summary.schema_version,
            slo=self.slo,
        )
        return Analysis(self.assembly, attr, summary, self.metadata, self.slo)


def _metadata(table: pa.Table) -> dict[str, Any]:
    """The run metadata in the table's schema (empty when absent or not a JSON object)."""
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def analyze(
    table: pa.Table,
    *,
    boundary: str | None = None,
    policy: str = "exclusive",
    trace: str = "",
    slo: Mapping[str, float] | None = None,
) -> Analysis:
    """Assemble, attribute and summarize a span table.

    Args:
        table: spans with ``SPAN_SCHEMA`` (from ``read_spans``), run metadata in its schema.
        boundary: ``client``, ``server`` or ``engine``; None for the outermost boundary at
            least one request supports.
        policy: ``exclusive``, ``shared`` or ``critical-path``.
        trace: the trace's path, echoed in the summary.
        slo: a limit in ms per metric (``ttft``, ``tpot``, ``itl``, ``e2e``) for the
            summary's goodput; None (or empty) for none.

    Raises:
        ValueError: an unknown boundary or policy, an unknown SLO metric or a limit that
            is not positive.
    """
    metadata = _metadata(table)
    version = metadata.get("schema_version", SCHEMA_VERSION)
    asm = assemble(table)
    attr = attribute(asm, boundary, policy)
    summary = summarize(
        attr,
        asm,
        trace=trace,
        schema_version=version if isinstance(version, int) else SCHEMA_VERSION,
        slo=slo,
    )
    raw_inputs = (table.schema.metadata or {}).get(INPUTS_KEY)
    if raw_inputs:
        summary.inputs = json.loads(raw_inputs)
    return Analysis(asm, attr, summary, metadata, slo or None)
