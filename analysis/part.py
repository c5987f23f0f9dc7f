"""The unit of every analysis: one table's requests analysed (a `Part`), and `merge`.

A table is a whole trace, or one partition of a dataset (``analysis.partition``: whole
requests, then copies of the engine step traces they joined, which other partitions own;
``tracer.schema.OWN_ROWS_KEY`` in its metadata says where the copies begin). The path is
the same for both (docs/architecture.md, "One program"):

1. `survey` (only where the table is not the whole trace, or a report is wanted): the
   table's clock bounds, its own ``step`` spans and ``engine_info`` events. The clock
   offsets are estimated over every table's bounds (``clocks.offsets_from_bounds``), the
   steps put on the trace's clock (`global_steps`) and the regime set up
   (`regime_inputs`), each once for the whole trace.
2. `analyze_part`: the table assembled with those offsets and attributed; the `Part` holds
   per-request values (``Attribution``, ``RequestValues``) and, for a report, per-request
   blame rows, prefill points and regime rows: each written once, here.
3. `merge`: the parts stacked in order and summarized once into the one ``Analysis``.

``analyze(table)`` is ``merge([analyze_part(table)])``; a dataset on a Dask cluster is the
merge of each partition's part. Every figure of the summary is computed from the merged
per-request values (percentiles over every request, means from exact integer sums), so
both give the same ``Analysis`` bit for bit (tests/analysis/test_part.py).

Pure functions (no I/O); where the tables come from and where each part runs is
``ttft.reports.runs.analyses``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis import _column_arrays as col
from ttft.analysis import clocks
from ttft.analysis._grouping import decode
from ttft.analysis._trees import CODE
from ttft.analysis.assemble import Assembly, assemble
from ttft.analysis.attribution import FRAMES, Attribution, attribute
from ttft.analysis.blame import blame
from ttft.analysis.order_stats import InMemory, PartSet
from ttft.analysis.part_figures import PartRows
from ttft.analysis.prefill import prefill_points
from ttft.analysis.quality import Quality
from ttft.analysis.regime import ENGINE_INFO, RegimeSetup, regime, regime_setup
from ttft.analysis.request_values import RequestValues, request_values, stack_frames
from ttft.analysis.result import Analysis, ReportRows
from ttft.analysis.summary import summary_of
from ttft.tracer.schema import (
    ATTR_DECODE_TOKENS,
    ATTR_PREFILL_TOKENS,
    ATTR_STEP_ID,
    BOUNDARY_NAMES,
    OWN_ROWS_KEY,
    SCHEMA_VERSION,
    run_metadata,
)
from ttft.tracer.span_ids import same_layout

__all__ = ["Part", "PartHeader", "ReportInputs", "StackedAttribution", "Survey",
           "analyze_part", "assemble_table", "attribute_part",
           "default_boundary", "global_steps", "locate", "merge", "merge_rows",
           "merged_quality", "own_rows",
           "reattributed", "regime_inputs", "report_rows", "survey", "with_report"]

_STEP_KEYS = (ATTR_STEP_ID, ATTR_PREFILL_TOKENS, ATTR_DECODE_TOKENS)


def own_rows(table: pa.Table) -> int:
    """How many leading rows of ``table`` it owns: every row, unless it is a partition
    read alone (``OWN_ROWS_KEY``)."""
    raw = (table.schema.metadata or {}).get(OWN_ROWS_KEY)
    return table.num_rows if raw is None else int(raw)


@dataclass
class Survey:
    """One table's first pass: its clock bounds, its own valid ``step`` spans and
    ``engine_info`` events (raw clocks, ``SPAN_SCHEMA``, in row order) and its run
    metadata."""

    bounds: clocks.Bounds
    steps: pa.Table
    engine_info: pa.Table
    metadata: dict[str, Any]


def survey(table: pa.Table, *, steps: bool = True, engine_info: bool = True) -> Survey:
    """The `Survey` of ``table`` (its borrowed copies are surveyed where they are owned);
    without ``steps`` or ``engine_info`` (what only a report or the regime reads), those
    tables are left empty, so a summary's first pass returns only what grows with the
    requests' clocks."""
    d = decode(table)
    own = np.arange(table.num_rows) < own_rows(table)
    found = np.flatnonzero(own & d.valid & (d.stage == CODE["step"])) if steps else []
    info = (own & np.asarray(pc.fill_null(pc.equal(table.column("name"), ENGINE_INFO), False)
                             .to_numpy(zero_copy_only=False), dtype=bool)
            if engine_info else np.zeros(table.num_rows, bool))
    plain = table.replace_schema_metadata(None)
    return Survey(clocks.table_bounds(table, d), plain.take(np.asarray(found, np.int64)),
                  plain.take(np.flatnonzero(info)), run_metadata(table))


def global_steps(surveys: Sequence[Survey], offsets: Sequence[clocks.ClockOffset]
                 ) -> pa.Table:
    """Every table's own ``step`` spans, in order, as blame and the waterfalls read them:
    ``name``, ``service``, ``clock``, ``start_ns`` and ``end_ns`` moved onto the client
    clock by ``offsets`` as ``assemble`` moves them (``clocks.row_shift``; a step on a
    ``gpu:*`` clock follows the host clock of its own trace, else of its service, among
    the steps), and ``attributes`` holding only the step's id and token counts (as
    ``_column_arrays.int_attribute`` reads them; -1 where absent), which keeps the table small."""
    steps = pa.concat_tables(same_layout([s.steps for s in surveys]))
    clock, clock_values = col.codes(steps.column("clock"))
    shift = clocks.row_shift(clock, clock_values, offsets,
                             lambda: col.trace_codes(steps.column("trace_id"))[0],
                             lambda: col.codes(steps.column("service"))[0])
    times = {name: col.int64(steps.column(name)) for name in ("start_ns", "end_ns")}
    if shift is not None:
        times = {name: ns + shift for name, ns in times.items()}
    every = np.arange(steps.num_rows)
    attributes = pc.binary_join_element_wise(*(
        pc.binary_join_element_wise(f'"{key}":', pa.array(col.int_attribute(
            steps.column("attributes"), every, key)).cast(pa.string()), "")
        for key in _STEP_KEYS), ",")
    return pa.table({
        "name": steps.column("name"), "service": steps.column("service"),
        "clock": steps.column("clock"),
        **{name: pa.array(ns, pa.int64()) for name, ns in times.items()},
        "attributes": pc.binary_join_element_wise("{", attributes, "}", ""),
    })


def regime_inputs(surveys: Sequence[Survey], options: Mapping[str, Any]) -> RegimeSetup:
    """The regime set up as for the whole trace: from its last ``engine_info`` event, in
    table order, and the first table's metadata; ``options`` are ``regime_setup``'s keyword
    arguments.

    Raises:
        ValueError: the model config (given or the trace's) is not a model shape.
    """
    info = pa.concat_tables(same_layout([s.engine_info for s in surveys]))
    return regime_setup(info, surveys[0].metadata, **options)


@dataclass(frozen=True)
class ReportInputs:
    """What a report's per-request rows need from the whole trace: every engine step on
    its clock (`global_steps`; None: the table's own, when it is the whole trace) and the
    regime's setup (None: no regime rows); ``rows`` False for the regime rows alone."""

    steps: pa.Table | None = None
    regime: RegimeSetup | None = None
    rows: bool = True


@dataclass
class Part:
    """One table analysed: its attribution (``request`` indices local to it) and its
    requests' values; the boundaries any of its requests supports; for a report
    (`ReportInputs`), its requests' blame rows, prefill points and, with a model shape,
    its chunks' regime rows (else None); and its assembly, when kept (``keep``) for views
    that draw spans (never shipped between processes)."""

    attribution: Attribution
    values: RequestValues
    boundaries: tuple[str, ...]
    report: ReportRows | None = None
    assembly: Assembly | None = field(default=None, repr=False)


def attribute_part(asm: Assembly, boundary: str | None, policy: str,
                   report: ReportInputs | None = None, *, keep: bool = False) -> Part:
    """The `Part` of an assembled table at ``boundary`` (None: its own outermost one) and
    ``policy``.

    Raises:
        ValueError: an unknown boundary or policy.
    """
    supported = tuple(name for name in BOUNDARY_NAMES if asm.has_window(name).any())
    attr = attribute(asm, boundary, policy)
    rows = None if report is None else report_rows(asm, report)
    return Part(attr, request_values(asm, attr), supported, rows, asm if keep else None)


def report_rows(asm: Assembly, report: ReportInputs) -> ReportRows:
    """The report's per-request rows of an assembled table (no boundary changes them)."""
    chunks = (None if report.regime is None or report.regime.shape is None
              else regime(asm, report.regime.shape, report.regime.peaks))
    return ReportRows(blame(asm, report.steps) if report.rows else None,
                      prefill_points(asm) if report.rows else None, chunks)


def reattributed(analysis: Analysis, boundary: str | None = None, policy: str | None = None
                 ) -> Analysis:
    """The same trace at another boundary or policy, from the analysis's assembly (its
    SLOs and report rows, which no boundary changes, reused).

    Raises:
        ValueError: an unknown boundary or policy, or an analysis without its assembly
            (one merged from partitions is analysed again by its driver).
    """
    if analysis.assembly is None:
        raise ValueError("an analysis merged from partitions is analysed again by its "
                         "driver (ttft.reports.runs.analyses)")
    part = attribute_part(analysis.assembly, boundary, policy or analysis.attribution.policy,
                          keep=True)
    part.report = analysis.report
    return merge([part], metadata=analysis.metadata, trace=analysis.summary.trace,
                 slo=analysis.slo, inputs=analysis.summary.inputs, regime=analysis.regime)


def with_report(analysis: Analysis, options: Mapping[str, Any] | None = None) -> Analysis:
    """``analysis``, analysed whole in this process (it holds its assembly), with the
    report's per-request rows and the regime set up by ``options`` (``regime_setup``'s
    keyword arguments; None: those it was set up with, else the trace's own)."""
    if analysis.assembly is None:
        raise ValueError("an analysis merged from partitions gets its report rows from its "
                         "driver (ttft.reports.runs.analyses)")
    setup = analysis.regime
    if options is not None or setup is None:
        setup = regime_setup(analysis.assembly.rows.table, analysis.metadata, **(options or {}))
    rows = report_rows(analysis.assembly, ReportInputs(None, setup))
    return replace(analysis, report=rows, regime=setup, regime_result=setup.result(rows.regime))


def analyze_part(table: pa.Table, *, offsets: Sequence[clocks.ClockOffset] | None = None,
                 boundary: str | None = None, policy: str = "exclusive",
                 report: ReportInputs | None = None, keep: bool = False) -> Part:
    """Assemble and attribute one table (`attribute_part`).

    Args:
        table: a whole trace, or one partition read alone (its copies after its
            `own_rows`: their defects are counted where they are owned).
        offsets: the trace's clock offsets (None: estimated from this table, which is
            then the whole trace).
        boundary: None for the table's own outermost boundary; the caller analyses it
            again at the trace's (`default_boundary`) when that differs.
        policy: the attribution policy.
        report: with the report's per-request rows (`ReportInputs`); None without.
        keep: keep the assembly in the part.

    Raises:
        ValueError: an unknown boundary or policy.
    """
    return attribute_part(assemble_table(table, offsets), boundary, policy, report, keep=keep)


def assemble_table(table: pa.Table, offsets: Sequence[clocks.ClockOffset] | None = None
                   ) -> Assembly:
    """``assemble`` of a whole trace or of one partition (its borrowed copies, after its
    `own_rows`, counted where they are owned) with the trace's ``offsets``."""
    mine = own_rows(table)
    borrowed = None
    if mine < table.num_rows:
        borrowed = np.arange(table.num_rows) >= mine
    return assemble(table, offsets=offsets, borrowed=borrowed)


def default_boundary(parts: Sequence[Part]) -> str:
    """The outermost boundary at least one request of any part supports (else ``engine``),
    as ``Assembly.default_boundary`` chooses for the whole."""
    supported = {name for part in parts for name in part.boundaries}
    return next((name for name in BOUNDARY_NAMES if name in supported), BOUNDARY_NAMES[-1])


def _requests_of(attr: Attribution) -> int:
    """The number of requests of the part's assembly (every request is in ``requests`` or
    ``failed``, or was left out as ``no_window``)."""
    return len(attr.requests) + len(attr.failed) + attr.quality.counts["no_window"]


def merged_quality(qualities: Sequence[Quality],
                   offsets: Sequence[clocks.ClockOffset] | None) -> Quality:
    """The parts' defects together, with the trace's clock offsets (None: the one part's)."""
    quality = Quality()  # the first part alone carries the importer's rejected spans
    for found in qualities:
        quality = quality.merged(found)
    quality.clocks = list(qualities[0].clocks if offsets is None else offsets)
    return quality


@dataclass(frozen=True)
class PartHeader:
    """What merging needs of a part besides its rows: its boundary and policy, defects,
    number of requests and the boundaries its requests support."""

    boundary: str
    policy: str
    quality: Quality
    requests: int
    boundaries: tuple[str, ...]

    @classmethod
    def of(cls, part: Part) -> PartHeader:
        attr = part.attribution
        return cls(attr.boundary, attr.policy, attr.quality, _requests_of(attr),
                   part.boundaries)


def _stacked_frames(attrs: Sequence[Attribution], counts: Sequence[int]
                    ) -> dict[str, pd.DataFrame]:
    """The parts' per-request frames stacked in order, ``request`` moved past the parts
    before (``counts``: their requests); ``covered`` is the stacked ``raw`` itself where
    every part's is its ``raw`` (one frame, as ``Attribution`` says), not stacked again."""
    shared = all(a.covered is a.raw for a in attrs)
    frames = {frame: stack_frames([getattr(a, frame) for a in attrs],
                                  counts if frame in ("requests", "failed") else None)
              for frame in FRAMES if not (shared and frame == "covered")}
    frames.setdefault("covered", frames["raw"])
    return frames


class StackedAttribution(Attribution):
    """The `Attribution` of a trace's parts: boundary, policy and merged defects at once;
    its per-request frames stacked from the parts (``request`` indices moved past the
    parts before) only when first read, so a summary never needs them."""

    def __init__(self, boundary: str, policy: str, quality: Quality, rows: PartSet,
                 counts: Sequence[int]) -> None:
        self.boundary, self.policy, self.quality = boundary, policy, quality
        self._rows, self._counts = rows, list(counts)

    def __getattr__(self, name: str) -> Any:
        if name not in FRAMES or "_rows" not in self.__dict__:
            raise AttributeError(name)
        self.__dict__.update(_stacked_frames(self._rows.map(lambda p: p.attribution),
                                             self._counts))
        return self.__dict__[name]

    def per_request_parts(self, write: Callable[[pd.DataFrame], None]) -> None:
        if "requests" in self.__dict__:
            return super().per_request_parts(write)
        self._rows.map(lambda p: write(p.attribution.per_request()))
        return None


def _merged_report(parts: Sequence[Part]) -> ReportRows | None:
    found = [part.report for part in parts]
    if any(rows is None for rows in found):
        return None
    def joined(frames: list[pd.DataFrame | None]) -> pd.DataFrame | None:
        return None if any(f is None for f in frames) else stack_frames(frames)

    regimes = [rows.regime for rows in found if rows.regime is not None]
    chunks = None
    if regimes:
        chunks = stack_frames(regimes)
        chunks.attrs["peaks"] = regimes[0].attrs.get("peaks")
    return ReportRows(joined([rows.blame for rows in found]),
                      joined([rows.prefill_points for rows in found]), chunks)


def merge(parts: Sequence[Part], *, offsets: Sequence[clocks.ClockOffset] | None = None,
          metadata: dict[str, Any] | None = None, trace: str = "",
          slo: Mapping[str, float] | None = None,
          inputs: list[dict[str, Any]] | None = None,
          regime: RegimeSetup | None = None) -> Analysis:
    """The one `Analysis` of a trace from its parts, all at one boundary and policy: `merge_rows`
    of their rows in memory, with their report rows and (one part) its assembly.

    Args:
        parts: every table's `Part`, in order.
        offsets: the clock offsets the parts were assembled with (None: the one part's own).
        metadata: the trace's run metadata (its first table's).
        trace: the trace's path, echoed in the summary.
        slo: SLO limits in ms per metric for the summary's goodput.
        inputs: what was read (``ttft.collectors.read_inputs``), echoed in the summary.
        regime: the regime's setup the parts' regime rows were costed with.

    Raises:
        ValueError: no parts, parts attributed at different boundaries or policies, or an
            unknown SLO metric.
    """
    if not parts:
        raise ValueError("no parts to merge")
    rows = InMemory([PartRows(part.attribution, part.values,
                              None if part.report is None else part.report.regime)
                     for part in parts])
    headers = [PartHeader.of(part) for part in parts]
    return merge_rows(rows, headers, offsets=offsets, metadata=metadata, trace=trace, slo=slo,
                      inputs=inputs, regime=regime, report=_merged_report(parts),
                      assembly=parts[0].assembly if len(parts) == 1 else None, stack=True)


def merge_rows(rows: PartSet, headers: Sequence[PartHeader], *,
               offsets: Sequence[clocks.ClockOffset] | None = None,
               metadata: dict[str, Any] | None = None, trace: str = "",
               slo: Mapping[str, float] | None = None,
               inputs: list[dict[str, Any]] | None = None,
               regime: RegimeSetup | None = None, report: ReportRows | None = None,
               assembly: Assembly | None = None, stack: bool = False) -> Analysis:
    """The `Analysis` of a trace's parts from their ``PartRows`` where they are kept
    (``order_stats.PartSet``: in memory, or spilled by a driver that holds none of their
    requests) and their `PartHeader` s; its summary is ``summary_of`` the rows, its
    regime's figures (with ``regime``) ``RegimeSetup.result_of`` their chunks, its
    attribution a `StackedAttribution` of them (with ``stack``, rows in memory, a plain
    ``Attribution``, its frames stacked now). Arguments as `merge`'s.

    Raises:
        ValueError: no parts, parts attributed at different boundaries or policies, or an
            unknown SLO metric.
    """
    if not headers:
        raise ValueError("no parts to merge")
    if len({(h.boundary, h.policy) for h in headers}) != 1:
        raise ValueError("parts were attributed at different boundaries or policies")
    metadata = metadata or {}
    version = metadata.get("schema_version", SCHEMA_VERSION)
    boundary, policy = headers[0].boundary, headers[0].policy
    quality = merged_quality([h.quality for h in headers], offsets)
    summary = summary_of(rows, boundary, policy, quality, trace=trace,
                         schema_version=version if isinstance(version, int) else SCHEMA_VERSION,
                         slo=slo)
    summary.inputs = inputs
    supported = tuple(name for name in BOUNDARY_NAMES
                      if any(name in h.boundaries for h in headers))
    counts = [h.requests for h in headers]
    if stack:
        frames = _stacked_frames(rows.map(lambda p: p.attribution), counts)
        attr: Attribution = Attribution(boundary, policy, frames["requests"],
                                        frames["attributed"], frames["covered"], frames["raw"],
                                        quality, frames["failed"])
    else:
        attr = StackedAttribution(boundary, policy, quality, rows, counts)
    found = None if regime is None else regime.result_of(rows, lambda p: p.chunks)
    return Analysis(attr, summary, metadata, slo or None, supported, report, regime, found,
                    assembly)


def locate(parts: Sequence[Part], request: int) -> tuple[int, int]:
    """``(part, its own request index)`` of request ``request`` of `merge`'s attribution
    (the ``request`` column of its frames)."""
    firsts = np.cumsum([_requests_of(part.attribution) for part in parts])
    k = int(np.searchsorted(firsts, request, side="right"))
    return k, request - (int(firsts[k - 1]) if k else 0)

