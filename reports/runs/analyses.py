"""The one driver: a trace location analysed, reported or compared, in this process or on a
Dask cluster, by the same steps (docs/architecture.md, "One program").

A `Runner` decides where each step runs: `InProcess` runs it here on the whole trace (one
piece, read once and kept), `OnDask` runs it as one task per partition of a dataset (each
task reads its partition whole: its own rows and the step traces it borrowed). The steps
are ``analysis.part``'s, whatever the runner:

1. where there are several pieces, or a report is wanted, a first pass: each piece's
   ``survey``; the driver estimates the clock offsets over every request, puts the engine
   steps on that clock (shared with every task) and sets the regime up, once;
2. ``analyze_part`` of each piece with those offsets; a piece whose outermost boundary is
   not the trace's (no boundary given) is analysed again at the trace's;
3. ``merge`` of the parts into the one ``Analysis``;
4. for a report, the waterfalls of the median, p99 and slowest requests, from the pieces
   holding them.

The driver never holds a piece's spans. Analysing a dataset on Dask (no report), its
memory does not follow the requests either: each part (its chunks' regime rows with
``--regime``) is kept as it comes while the parts fit ``part_sets.KEEP_BYTES`` and
spilled to disk beyond (``part_sets.Spilled``), and the summary and the regime's figures
are made from reductions over the parts, read one at a time, exact percentiles by
histogram refinement (``analysis.order_stats``); so are the clock offsets, over the
spilled bounds. Without the regime, a piece whose own requests move no clock is analysed in
its first task (`_fused`). What reads every request together (``compare``'s bootstrap)
stacks them then; a report keeps its parts in memory.

Dask (``distributed``) is the ``dask`` extra: ``pip install 'ttft[dask]'``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from ttft.analysis.clock_offset import ClockOffset
from ttft.analysis.clocks import clock_shifts, offsets_from_bounds
from ttft.analysis.order_stats import Spilled, keyed_bytes, load_keyed, save_keyed
from ttft.analysis.part import (
    Part,
    PartHeader,
    ReportInputs,
    Survey,
    analyze_part,
    assemble_table,
    default_boundary,
    global_steps,
    locate,
    merge,
    merge_rows,
    reattributed,
    regime_inputs,
    survey,
)
from ttft.analysis.part_figures import PartRows
from ttft.analysis.regime import RegimeSetup, regime_setup
from ttft.analysis.result import Analysis
from ttft.collectors.location import TraceLocation
from ttft.reports.report_data import (
    ReportData,
    Waterfall,
    build_report,
    chosen_requests,
    request_spans,
    waterfall,
)
from ttft.reports.runs.runners import (
    WORKER_ENVIRON,
    DaskMissing,
    InProcess,
    OnDask,
    Piece,
    Runner,
    local_cluster,
    runner,
)
from ttft.tracer.schema import read_inputs, run_metadata

__all__ = ["WORKER_ENVIRON", "DaskMissing", "InProcess", "OnDask", "Runner",
           "analyze_location", "compare_locations", "local_cluster", "report_location",
           "runner"]

# --- the tasks: module-level functions of (location, piece, ...) --------------------------

def _table(location: TraceLocation, piece: Piece) -> Any:
    if piece is None:  # the whole trace: read once in this process, then kept
        location.table = location.read(native=True)
        return location.table
    return location.read(piece, native=True)


def _survey_task(location: TraceLocation, piece: Piece, steps: bool = True,
                 engine_info: bool = True) -> Survey:
    return survey(_table(location, piece), steps=steps, engine_info=engine_info)


def _whole_task(location: TraceLocation, piece: Piece, options: Mapping[str, Any] | None
                ) -> tuple[dict[str, Any], list[dict[str, Any]] | None, RegimeSetup | None]:
    """The first pass of a trace in one piece (no survey): what the merge echoes, its run
    metadata and inputs, and the regime set up by ``options`` (None: none)."""
    table = _table(location, piece)
    metadata = run_metadata(table)
    setup = None if options is None else regime_setup(table, metadata, **options)
    return metadata, read_inputs(table), setup


def _first_task(location: TraceLocation, piece: Piece, boundary: str | None, policy: str
                ) -> tuple[Survey, Part | None]:
    """The first pass of a piece analysed without a report or the regime: its survey and,
    where the offsets its own requests give move no clock (one host, or clocks already
    consistent: the common case), its part too, assembled with them: the driver
    keeps it when the offsets over every piece move no clock either (the same shifts,
    so the same part), else analyses the piece again."""
    table = _table(location, piece)
    found = survey(table, steps=False, engine_info=False)
    own = offsets_from_bounds([found.bounds])
    part = (None if clock_shifts(own) else
            analyze_part(table, offsets=own, boundary=boundary, policy=policy))
    return found, part


def _part_task(location: TraceLocation, piece: Piece, offsets: Sequence[ClockOffset] | None,
               boundary: str | None, policy: str, report: ReportInputs | None, steps: Any,
               keep: bool) -> Part:
    """``analyze_part`` of the piece; ``steps`` (the trace's, an argument of its own so
    that a cluster hands the task the table it shared, not a reference to it) go into
    ``report``."""
    if report is not None and steps is not None:
        report = replace(report, steps=steps)
    return analyze_part(_table(location, piece), offsets=offsets, boundary=boundary,
                        policy=policy, report=report, keep=keep)


def _spans_task(location: TraceLocation, piece: Piece, offsets: Sequence[ClockOffset] | None,
                steps: Any, wanted: Sequence[tuple[int, int, int]], asm: Any) -> list[pd.DataFrame]:
    """``request_spans`` of each ``(request, a_ns, b_ns)`` of the piece, from its assembly
    (``asm``, the part's when this process kept it; else assembled again here)."""
    if asm is None:
        asm = assemble_table(_table(location, piece), offsets)
    return [request_spans(asm, request, a_ns, b_ns, steps) for request, a_ns, b_ns in wanted]


# --- the driver ----------------------------------------------------------------------------

@dataclass
class _Run:
    """A location analysed: the analysis and what a later step needs of the run."""

    analysis: Analysis
    parts: list[Part]
    pieces: list[Piece]
    offsets: list[ClockOffset] | None
    steps: Any


def _analyzed(location: TraceLocation, run: Runner, *, boundary: str | None, policy: str,
              slo: Mapping[str, float] | None, regime: Mapping[str, Any] | None,
              rows: bool, on_done: Callable[[], None] | None) -> _Run:
    pieces = run.pieces(location)
    offsets: list[ClockOffset] | None = None
    steps = None
    if len(pieces) > 1 and regime is None and not run.keeps:
        analysis, offsets = _fused(location, run, pieces, boundary, policy, on_done,
                                   trace=str(location), slo=slo)
        return _Run(analysis, [], pieces, offsets, None)
    if len(pieces) > 1:
        surveys, offsets = _surveyed(location, run, pieces, regime is not None and rows,
                                     regime is not None, on_done)
        metadata, inputs = surveys[0].metadata, None
        setup = None if regime is None else regime_inputs(surveys, regime)
        if regime is not None and rows:
            steps = run.share(global_steps(surveys, offsets))
    else:
        ((metadata, inputs, setup),) = run.map(_whole_task, location, pieces, regime,
                                               on_done=on_done)
    report = None if regime is None else ReportInputs(None, setup, rows)
    if not rows and not run.keeps:
        analysis = _spilled(location, run, pieces, offsets, boundary, policy, report,
                            on_done, metadata=metadata, trace=str(location), slo=slo,
                            inputs=inputs, regime=setup)
        return _Run(analysis, [], pieces, offsets, steps)
    keep = run.keeps
    parts = run.map(_part_task, location, pieces, offsets, boundary, policy, report, steps,
                    keep, on_done=on_done)
    chosen = boundary or default_boundary(parts)
    again = [k for k, part in zip(pieces, parts, strict=True)
             if part.attribution.boundary != chosen]
    if again:
        redone = dict(zip(again, run.map(_part_task, location, again, offsets, chosen, policy,
                                         report, steps, keep), strict=True))
        parts = [redone.get(k, part) for k, part in zip(pieces, parts, strict=True)]
    analysis = merge(parts, offsets=offsets, metadata=metadata, trace=str(location), slo=slo,
                     inputs=inputs, regime=setup)
    return _Run(analysis, parts, pieces, offsets, steps)


class _Bounds:
    """The first pass's surveys as they come: each piece's bounds spilled (16 bytes a
    request and server clock; in memory within ``part_sets.KEEP_BYTES``), the rest of
    its survey kept, so the driver holds no request's bounds while it estimates."""

    def __init__(self, pieces: list[Piece]) -> None:
        self.pieces, self.order = pieces, {piece: k for k, piece in enumerate(pieces)}
        self.spilled = Spilled(save=save_keyed, load=load_keyed, size=keyed_bytes)
        self.surveys: dict[Piece, Survey] = {}

    def take(self, piece: Piece, surveyed: Survey) -> None:
        self.spilled.put(self.order[piece], surveyed.bounds)
        self.surveys[piece] = replace(surveyed, bounds={})

    def offsets(self) -> list[ClockOffset]:
        """The offsets over every piece's requests (the spilled bounds then go)."""
        with self.spilled:
            return offsets_from_bounds(self.spilled)


def _surveyed(location: TraceLocation, run: Runner, pieces: list[Piece], steps: bool,
              engine_info: bool, on_done: Callable[[], None] | None
              ) -> tuple[list[Survey], list[ClockOffset]]:
    """Every piece's `Survey` (without its bounds) and the clock offsets over all of
    them (`_Bounds`)."""
    found = _Bounds(pieces)
    run.map(_survey_task, location, pieces, steps, engine_info, on_done=on_done,
            sink=found.take)
    offsets = found.offsets()
    return [found.surveys[k] for k in pieces], offsets


def _spill() -> Spilled:
    """Where a driver keeps the parts as they come: in memory within
    ``part_sets.KEEP_BYTES``, the rest on its disk."""
    return Spilled(save=PartRows.save, load=PartRows.load, size=PartRows.nbytes)


def _fused(location: TraceLocation, run: Runner, pieces: list[Piece], boundary: str | None,
           policy: str, on_done: Callable[[], None] | None, **merged: Any
           ) -> tuple[Analysis, list[ClockOffset]]:
    """`_surveyed` and `_spilled` in as few passes as the clocks allow: each piece's first
    task (`_first_task`) also analyses it where its own requests move no clock; when the
    offsets over every piece move none either, those parts are the trace's and stand
    (one pass over such pieces instead of two), the others are analysed with the
    offsets."""
    found = _Bounds(pieces)
    rows = _spill()
    headers: dict[Piece, PartHeader] = {}

    def sink(piece: Piece, first: tuple[Survey, Part | None]) -> None:
        surveyed, part = first
        found.take(piece, surveyed)
        if part is not None:
            headers[piece] = PartHeader.of(part)
            rows.put(found.order[piece], PartRows(part.attribution, part.values))

    run.map(_first_task, location, pieces, boundary, policy, on_done=on_done, sink=sink)
    offsets = found.offsets()
    if clock_shifts(offsets):  # the parts moved no clock, the trace's offsets do
        headers.clear()
    for _ in headers:  # analysed in their first pass
        if on_done is not None:
            on_done()
    analysis = _spilled(location, run, pieces, offsets, boundary, policy, None, on_done,
                        rows=rows, headers=headers,
                        metadata=found.surveys[pieces[0]].metadata,
                        inputs=None, regime=None, **merged)
    return analysis, offsets


def _spilled(location: TraceLocation, run: Runner, pieces: list[Piece],
             offsets: list[ClockOffset] | None, boundary: str | None, policy: str,
             report: ReportInputs | None, on_done: Callable[[], None] | None, *,
             rows: Spilled | None = None, headers: dict[Piece, PartHeader] | None = None,
             **merged: Any) -> Analysis:
    """The analysis of a dataset's pieces with a driver that holds none of their requests:
    each part (with ``report``, the regime rows alone, its chunks' regime rows), as it
    comes, spilled to disk (``part_sets.Spilled``) but for its `PartHeader`; the
    summary and the regime's figures made from the spilled rows (``merge_rows``). Pieces
    with a header in ``headers`` already have their part in ``rows``."""
    rows = rows if rows is not None else _spill()
    headers = headers if headers is not None else {}
    order = {piece: k for k, piece in enumerate(pieces)}

    def sink(piece: Piece, part: Part) -> None:
        headers[piece] = PartHeader.of(part)
        chunks = None if part.report is None else part.report.regime
        rows.put(order[piece], PartRows(part.attribution, part.values, chunks))

    todo = [k for k in pieces if k not in headers]
    run.map(_part_task, location, todo, offsets, boundary, policy, report, None, False,
            on_done=on_done, sink=sink)
    chosen = boundary or default_boundary(list(headers.values()))
    again = [k for k in pieces if headers[k].boundary != chosen]
    if again:
        run.map(_part_task, location, again, offsets, chosen, policy, report, None, False,
                sink=sink)
    return merge_rows(rows, [headers[k] for k in pieces], offsets=offsets, **merged)


def analyze_location(location: TraceLocation, run: Runner, *, boundary: str | None = None,
                     policy: str = "exclusive", slo: Mapping[str, float] | None = None,
                     regime: Mapping[str, Any] | None = None,
                     on_done: Callable[[], None] | None = None) -> Analysis:
    """The `Analysis` of ``location`` (see the module docstring).

    Args:
        location: the trace.
        run: where the steps run.
        boundary, policy, slo: as ``ttft.analysis.analyze``.
        regime: ``regime_setup``'s keyword arguments for the chunks' regime rows (``{}``:
            the trace's own model and device); None for none.
        on_done: called after each task of each pass (a progress bar).

    Raises:
        DaskMissing, TraceFileError: as `runner` and ``read_spans``.
        ValueError: an unknown boundary or policy, an SLO or a model config refused.
    """
    return _analyzed(location, run, boundary=boundary, policy=policy, slo=slo, regime=regime,
                     rows=False, on_done=on_done).analysis


def report_location(location: TraceLocation, run: Runner, *, boundary: str | None = None,
                    policy: str = "exclusive", slo: Mapping[str, float] | None = None,
                    regime: Mapping[str, Any] | None = None,
                    on_done: Callable[[], None] | None = None) -> ReportData:
    """Everything ``ttft report`` shows of ``location`` (``build_report``), its
    waterfalls drawn from the pieces holding the chosen requests.

    Raises:
        as `analyze_location`.
    """
    done = _analyzed(location, run, boundary=boundary, policy=policy, slo=slo,
                     regime=dict(regime or {}), rows=True, on_done=on_done)
    return build_report(done.analysis, waterfalls=_waterfalls(location, run, done))


def compare_locations(locations: Sequence[TraceLocation], run: Runner, *,
                      boundary: str | None = None, policy: str = "exclusive",
                      slo: Mapping[str, float] | None = None,
                      choose: Callable[[list[tuple[str, ...]]], str] | None = None,
                      on_done: Callable[[], None] | None = None) -> list[Analysis]:
    """Several traces analysed at one boundary, for ``ttft compare``: ``boundary``, else
    ``choose`` of the boundaries each supports (default: the first one's outermost); a
    trace analysed at another is analysed again at it.

    Raises:
        as `analyze_location`, and whatever ``choose`` raises.
    """
    def one(location: TraceLocation, at: str | None, done: Any) -> Analysis:
        return analyze_location(location, run, boundary=at, policy=policy, slo=slo,
                                on_done=done)

    found = [one(location, boundary, on_done) for location in locations]
    chosen = boundary or (choose or (lambda seen: seen[0][0]))([a.boundaries for a in found])
    return [a if a.attribution.boundary == chosen
            else reattributed(a, chosen) if a.assembly is not None
            else one(location, chosen, None)
            for location, a in zip(locations, found, strict=True)]


def _waterfalls(location: TraceLocation, run: Runner, done: _Run) -> list[Waterfall]:
    """The waterfalls of `chosen_requests`, each request's spans from its piece (one task
    per piece holding one) and the engine steps from the run's steps (None: the piece's
    own, when it is the whole trace)."""
    attribution = done.analysis.attribution
    chosen = chosen_requests(attribution)
    if not chosen:
        return []
    where = [locate(done.parts, int(attribution.requests["request"].iloc[row]))
             for _, row in chosen]
    wanted: dict[Piece, list[tuple[int, int, int]]] = {}
    for (k, local), (_, row) in zip(where, chosen, strict=True):
        a_ns = int(attribution.requests["a_ns"].iloc[row])
        b_ns = a_ns + int(attribution.requests["ttft_ns"].iloc[row])
        wanted.setdefault(done.pieces[k], []).append((local, a_ns, b_ns))
    holding = [piece for piece in done.pieces if piece in wanted]
    kept = {piece: part.assembly for piece, part in zip(done.pieces, done.parts, strict=True)}
    fetched = run.map(_spans_task, location, holding, done.offsets, done.steps,
                      each={piece: (wanted[piece], kept[piece]) for piece in holding})
    frames = {(piece, local): frame
              for piece, batch in zip(holding, fetched, strict=True)
              for (local, _, _), frame in zip(wanted[piece], batch, strict=True)}
    return [waterfall(label, attribution.requests.iloc[row], attribution.attributed.iloc[row],
                      frames[(done.pieces[k], local)])
            for (label, row), (k, local) in zip(chosen, where, strict=True)]

