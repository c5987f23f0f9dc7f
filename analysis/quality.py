"""Data-quality defects: counted with a few examples each, never fatal.

docs/design.md names the defects; analysis drops or repairs what it must (a span ending before
it starts, a duplicate span id) and goes on with the rest, so valid data around a defect
is never lost. The counts travel with every analysis result and are printed beside it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from ttft.analysis.clock_offset import ClockOffset
from ttft.tracer.schema import run_metadata

DEFECTS: tuple[str, ...] = (
    "missing_field",
    "end_before_start",
    "no_window",
    "orphan_parent",
    "duplicate_span_id",
    "outside_window",
    "clock_shift",
    "rejected_span",
    "estimated_span",
    "reused_step_id",
)
"""Every defect analysis counts; ``missing_field`` (a row without trace id or times, or
with a time outside ``analysis.clock_offset.TIME_LIMIT_NS``) is ttft's addition to docs/design.md's
list, and so is ``rejected_span`` (a span the importer could not turn into a row, counted
in the table's run metadata under ``rejected``: ``{"count": n, "examples": [...]}``), and
``estimated_span`` (a span whose interval the source estimated rather than measured, such as
Dynamo's K/V transfer upper bound: kept and attributed, counted in the run metadata under
``estimated`` in the same shape, each carrying ``tracer.schema.ATTR_ESTIMATED``; ``ttft
trace`` counts there the spans it placed from a server's reported timings), and
``reused_step_id`` (a prefill chunk whose step id names steps of several engine traces,
joined to the one nearest in time)."""

MEANING: dict[str, str] = {
    "missing_field": "row without trace_id, start_ns or end_ns, or with a time beyond "
    "±2^62 ns, the years 1824-2116 (row dropped)",
    "end_before_start": "span with end_ns < start_ns (row dropped)",
    "no_window": "request without a TTFT window at the chosen boundary (left out)",
    "orphan_parent": "span whose parent_id is not in its request (attached to the root)",
    "duplicate_span_id": "span id seen twice in one request (later copies dropped)",
    "outside_window": "request-level span wholly outside its request's client/server span",
    "clock_shift": "server span starts before its client span, after clock alignment",
    "rejected_span": "span the importer could not store (a bad id or time; not in the table)",
    "estimated_span": "span the source estimated, not measured (Dynamo's kv_transfer, an "
    "upper bound; a server's reported timings, placed by the client: attributed only "
    "without measured server spans)",
    "reused_step_id": "prefill chunk whose (service, step_id) names steps of several engine "
    "traces (a restart, replicas sharing a service name): joined to the nearest in time",
}

EXAMPLES_KEPT = 3


@dataclass
class Quality:
    """Counts and a few example ids (trace ids or span ids) per defect, and the clock
    offsets of the trace (one per client/server clock pair)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DEFECTS, 0))
    examples: dict[str, list[str]] = field(default_factory=lambda: {d: [] for d in DEFECTS})
    clocks: list[ClockOffset] = field(default_factory=list)

    def add(self, defect: str, count: int, examples: Iterable[str] = ()) -> None:
        """Count ``count`` occurrences of ``defect`` and keep the smallest few examples
        (of these and those kept before): the same whatever the order of the rows or of
        the parts a dataset was analysed in, so pass every example, not the first few."""
        if defect not in self.counts:
            raise KeyError(f"unknown data-quality defect {defect!r}")
        if count <= 0:
            return
        self.counts[defect] += int(count)
        smallest = heapq.nsmallest(EXAMPLES_KEPT, {str(e) for e in examples})  # distinct
        kept = self.examples[defect]
        kept[:] = sorted(set(kept) | set(smallest))[:EXAMPLES_KEPT]

    def merged(self, other: Quality) -> Quality:
        """A new Quality with both sets of counts (and both clock lists, without repeats)."""
        out = Quality()
        for source in (self, other):
            for defect in DEFECTS:
                out.add(defect, source.counts[defect], source.examples[defect])
            out.clocks.extend(c for c in source.clocks if c not in out.clocks)
        return out

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def rejected_spans(table: pa.Table) -> tuple[int, list[str]]:
    """The count and examples of the spans the importer rejected (the ``rejected_span``
    defect), from the run metadata's ``rejected`` (``count`` and
    ``examples``); ``(0, [])`` when absent or malformed."""
    return _counted(table, "rejected")


def estimated_spans(table: pa.Table) -> tuple[int, list[str]]:
    """The count and examples of the spans whose interval the source estimated (the
    ``estimated_span`` defect), from the run metadata's ``estimated``, shaped as
    ``rejected`` is; ``(0, [])`` when absent or malformed."""
    return _counted(table, "estimated")


def _counted(table: pa.Table, key: str) -> tuple[int, list[str]]:
    counted = run_metadata(table).get(key)
    if not isinstance(counted, dict):
        return 0, []
    count, examples = counted.get("count"), counted.get("examples")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return 0, []  # malformed, as `tracer.schema.counted_sums` reads it: never a negative count
    return count, [str(e) for e in examples] if isinstance(examples, list) else []
