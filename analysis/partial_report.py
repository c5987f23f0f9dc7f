"""What a latency report needs beyond the summary, from a dataset's partitions, equal to
what one process finds in the whole (``ttft report DATASET --workers N``).

Blame splits each wait by every engine ``step`` of its ``(service, clock)``, and a partition
holds only the step traces its requests joined: so the first pass (`survey_part`, along
with the clock bounds) returns each partition's own ``step`` spans (one row per engine
step) and ``engine_info`` events, and `global_steps` puts the steps of the whole dataset on
the dataset's clock. The second pass (`report_part`) assembles a partition once and returns
its `Part`, its requests' blame rows against those global steps, its prefill points and the
regime rows of its own chunks (``prefill.chunk`` spans live in request traces, so no
partition's borrowed copies hold one and none is counted twice). `merge_report_parts`
stacks them; the driver summarizes once.

Pure functions (no I/O); the orchestration lives in ``ttft.reports.runs.distributed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis import _columns as col
from ttft.analysis import clocks
from ttft.analysis._grouping import decode
from ttft.analysis._trees import CODE
from ttft.analysis.blame import blame
from ttft.analysis.partial import Part, _stacked, assemble_part, part_bounds, part_of
from ttft.analysis.pipeline import _metadata
from ttft.analysis.prefill import prefill_points
from ttft.analysis.regime import ENGINE_INFO, ModelShape, Peaks, regime
from ttft.tracer.schema import ATTR_DECODE_TOKENS, ATTR_PREFILL_TOKENS, ATTR_STEP_ID

_STEP_KEYS = (ATTR_STEP_ID, ATTR_PREFILL_TOKENS, ATTR_DECODE_TOKENS)

__all__ = ["ReportPart", "Survey", "global_steps", "merge_report_parts", "report_part",
           "survey_part"]


@dataclass
class Survey:
    """One partition's first pass: its clock bounds, its own valid ``step`` spans and
    ``engine_info`` events (raw clocks, ``SPAN_SCHEMA``, in row order) and its run metadata
    (``Analysis.metadata``)."""

    bounds: clocks.Bounds
    steps: pa.Table
    engine_info: pa.Table
    metadata: dict[str, Any]


def survey_part(table: pa.Table, own_rows: int) -> Survey:
    """The `Survey` of one partition (own rows first, then ``own_rows`` onwards the copies
    it borrowed, which are surveyed where they are owned)."""
    d = decode(table)
    own = np.arange(table.num_rows) < own_rows
    steps = np.flatnonzero(own & d.valid & (d.stage == CODE["step"]))
    info = own & np.asarray(pc.fill_null(pc.equal(table.column("name"), ENGINE_INFO), False)
                            .to_numpy(zero_copy_only=False), dtype=bool)
    plain = table.replace_schema_metadata(None)
    return Survey(part_bounds(table, d), plain.take(steps), plain.take(np.flatnonzero(info)),
                  _metadata(table))


def global_steps(surveys: Sequence[Survey], offsets: Sequence[clocks.ClockOffset]
                 ) -> pa.Table:
    """Every partition's own ``step`` spans, in partition order, as blame and the waterfalls
    read them: ``name``, ``service``, ``clock``, ``start_ns`` and ``end_ns`` moved onto the
    client clock by ``offsets`` as ``assemble`` moves them (``clocks.row_shift``; a step on
    a ``gpu:*`` clock follows the host clock of its own trace, else of its service, among
    the steps), and ``attributes`` holding only the step's id and token counts (as
    ``_columns.int_attribute`` reads them; -1 where absent), which keeps the table small."""
    steps = pa.concat_tables([survey.steps for survey in surveys])
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


@dataclass
class ReportPart:
    """One partition's second pass: its `Part`, the `blame` rows of its requests, its
    `prefill_points` and, with a model shape, its `regime` rows (None without)."""

    part: Part
    blame: pd.DataFrame
    prefill_points: pd.DataFrame
    regime: pd.DataFrame | None


def report_part(table: pa.Table, own_rows: int, offsets: Sequence[clocks.ClockOffset],
                boundary: str | None, policy: str, steps: pa.Table,
                shape: ModelShape | None = None, peaks: Peaks | None = None) -> ReportPart:
    """Assemble one partition once (``partial.assemble_part``) and analyse it for the
    report: its `Part` at ``boundary`` (None: its own outermost) and ``policy``, blame
    against ``steps`` (`global_steps`), prefill points and regime rows.

    Raises:
        ValueError: an unknown boundary or policy.
    """
    asm = assemble_part(table, own_rows, offsets)
    return ReportPart(part_of(asm, boundary, policy), blame(asm, steps), prefill_points(asm),
                      None if shape is None else regime(asm, shape, peaks))


def merge_report_parts(parts: Sequence[ReportPart]
                       ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """``(blame rows, prefill points, regime rows or None)`` of the whole dataset, each the
    partitions' rows stacked in partition order (the regime rows keep the peaks in
    ``attrs["peaks"]``, as `regime` leaves them).

    Raises:
        ValueError: no parts.
    """
    if not parts:
        raise ValueError("no partitions to merge")
    regimes = [part.regime for part in parts if part.regime is not None]
    found = None
    if regimes:
        found = _stacked(regimes)
        found.attrs["peaks"] = regimes[0].attrs.get("peaks")
    return (_stacked([part.blame for part in parts]),
            _stacked([part.prefill_points for part in parts]), found)
