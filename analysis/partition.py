"""Which partition of a dataset each span belongs to, so that every partition holds whole
requests and everything the analysis joins to them (docs/attribution.md, "Requests").

The key is the request, as ``assemble`` forms it: its ``request_id`` when it has one, else
its smallest trace id, hashed (``pandas.util.hash_array``, the same in every process) modulo
the partition count; every trace of a request (client and server traces sharing a request
id) goes with it. A trace that is not a request (an engine's step trace, with the ``gpu``
spans that ``assemble`` joins to a request's ``prefill.chunk`` spans by ``(service,
step_id)``) is owned by the partition of its own trace id's hash, and copied whole into
every other partition holding a request whose chunks ran in that step. Partitioning by
trace id alone would split those joins; a copy is read by the partition's analysis but
never counted twice (``assemble(..., borrowed=...)``) and never read by ``read_spans``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis import _column_arrays as col
from ttft.analysis._grouping import (
    Decoded,
    decode,
    request_traces,
    trace_request_ids,
)
from ttft.analysis._trees import CODE
from ttft.tracer.schema import ATTR_STEP_ID

__all__ = ["KEY_RULE", "PartitionPlan", "Partitioning", "partition_rows"]

KEY_RULE = ("request (request_id, else its smallest trace_id), hashed; engine step traces "
            "copied into every partition whose requests' prefill chunks ran in them")


@dataclass
class Partitioning:
    """Where each row of a table goes.

    Attributes:
        owner: int32 per row, the partition that holds it (exactly one).
        copy_rows: int64, rows also copied into another partition...
        copy_partitions: int32, ...namely this one (same length as ``copy_rows``).
        requests: requests in the table.
        key: the rule, in words (`KEY_RULE`).
    """

    owner: np.ndarray
    copy_rows: np.ndarray
    copy_partitions: np.ndarray
    requests: int
    key: str = KEY_RULE


def _hash_mod(values: np.ndarray, partitions: int) -> np.ndarray:
    if len(values) == 0:
        return np.empty(0, np.int32)
    hashed = pd.util.hash_array(values.astype(object), categorize=False)
    return (hashed % np.uint64(partitions)).astype(np.int32)


def partition_rows(table: pa.Table, partitions: int) -> Partitioning:
    """Partition a span table (``tracer.schema.SPAN_SCHEMA``) into ``partitions`` parts:
    `PartitionPlan` over the table as one batch, so a table in memory and a trace read
    batch by batch are partitioned by one program.

    Raises:
        ValueError: ``partitions`` below 1.
    """
    plan = PartitionPlan(partitions)
    d = decode(table)  # once: the route reads the trace codes the survey decoded
    plan.survey(table, d)
    plan.finish()
    return plan.route(table, (d.trace, d.trace_values))


def _rows_of(trace: np.ndarray, traces: np.ndarray, parts: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """Every row of each listed trace, with the pair's partition."""
    if len(traces) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(trace, kind="stable")
    sorted_trace = trace[order]
    lo = np.searchsorted(sorted_trace, traces, "left")
    hi = np.searchsorted(sorted_trace, traces, "right")
    many = hi - lo
    first = np.repeat(lo - np.concatenate([[0], np.cumsum(many)[:-1]]), many)
    rows = order[first + np.arange(int(many.sum()))]
    return rows.astype(np.int64), np.repeat(parts, many)


# --- the same rule over batches: a plan surveyed first, then each batch routed ------------
#
# Every input of ``partition_rows`` that decides where a trace goes is the trace's own:
# whether it is a request (a valid request-stage span or boundary event), its smallest
# request id, its id. So a first pass over batches keeps, per trace, only those (keyed by
# two 64-bit hashes of its id), plus the ``(service, step_id)`` keys of chunk and gpu rows;
# a second pass routes each batch by them. Neither pass holds a span.

_SECOND_KEY = "ttft.partition.2"
"""The second hash's key (16 bytes): a trace is known by two independent 64-bit hashes."""
_REDUCE_ROWS = 1 << 20
"""Survey entries kept before they are first reduced to one per trace (or step key);
later, whenever the new entries outnumber the reduced ones (so reducing costs time linear
in the input)."""
_TRACES = pa.schema([("h1", pa.uint64()), ("h2", pa.uint64()), ("req", pa.bool_()),
                     ("rid", pa.string())])


def _hashes(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Two independent 64-bit hashes of each value; the first is `_hash_mod`'s. Two trace
    ids sharing both (about 2^-128 for a pair) would be partitioned as one trace."""
    obj = np.asarray(values, dtype=object)
    return (pd.util.hash_array(obj, categorize=False),
            pd.util.hash_array(obj, hash_key=_SECOND_KEY, categorize=False))


def _traces_reduced(tables: list[pa.Table]) -> pa.Table:
    """One row per trace (``h1``, ``h2``) of ``tables``: a request if any row says so, its
    smallest request id."""
    table = pa.concat_tables(tables) if tables else _TRACES.empty_table()
    found = table.group_by(["h1", "h2"], use_threads=False).aggregate(
        [("req", "any"), ("rid", "min")])
    return found.rename_columns({"req_any": "req", "rid_min": "rid"}).select(_TRACES.names)


class _StepKeys:
    """The distinct ``(service, step id, trace)`` of one kind of row (chunks, or gpu work)
    seen so far: int32 service codes, int64 step ids, the trace's two hashes; 28 B a key."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._kept = self._pending = 0

    def add(self, service: np.ndarray, step: np.ndarray, h1: np.ndarray, h2: np.ndarray
            ) -> None:
        if len(step):
            self._parts.append((service, step, h1, h2))
            self._pending += len(step)
            if self._pending > max(_REDUCE_ROWS, self._kept):
                self._reduce()

    def _reduce(self) -> None:
        columns = [np.concatenate(c) for c in zip(*self._parts, strict=True)]
        order = np.lexsort(columns[::-1])
        columns = [c[order] for c in columns]
        new = np.ones(len(order), bool)
        for c in columns:
            new[1:] |= c[1:] != c[:-1]
        self._parts = [tuple(c[new] for c in columns)]
        self._kept, self._pending = int(new.sum()), 0

    def frame(self) -> pd.DataFrame:
        if self._parts:
            self._reduce()
        service, step, h1, h2 = self._parts[0] if self._parts else (
            np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.uint64),
            np.empty(0, np.uint64))
        self._parts = []
        return pd.DataFrame({"service": service, "step": step, "h1": h1, "h2": h2})


class PartitionPlan:
    """`partition_rows`' rule over a trace read in batches, in two passes: `survey` every
    batch, `finish`, then `route` every batch (the same batches, in any order). What it
    holds is per trace (two hashes, a flag, its smallest request id) and per step key,
    never per span, so a trace of any size is partitioned in memory bounded by its traces.

    Raises:
        ValueError: ``partitions`` below 1.
    """

    def __init__(self, partitions: int) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        self.partitions = partitions
        self.rows = 0
        self._traces: list[pa.Table] = []
        self._kept = self._pending = 0
        self._chunks, self._gpus = _StepKeys(), _StepKeys()
        self._services: dict[str, int] = {}
        self.requests = 0
        self._h1 = self._h2 = self._part = self._copy_at = self._copy_part = None

    def survey(self, table: pa.Table, d: Decoded | None = None) -> None:
        """Take what decides the partitioning of one batch's traces (``d``: the batch
        decoded, when the caller has it)."""
        self.rows += table.num_rows
        d = decode(table) if d is None else d
        if not d.trace_values:
            return
        is_req = request_traces(d)
        rid_code, rid_values = trace_request_ids(table, d)
        h1, h2 = _hashes(d.trace_values)
        rids = pa.array([*rid_values, None], pa.string()).take(
            pa.array(np.where(rid_code >= 0, rid_code, len(rid_values))))
        self._traces.append(pa.Table.from_arrays(
            [pa.array(h1), pa.array(h2), pa.array(is_req), rids], schema=_TRACES))
        self._pending += len(h1)
        if self._pending > max(_REDUCE_ROWS, self._kept):
            self._traces = [_traces_reduced(self._traces)]
            self._kept, self._pending = self._traces[0].num_rows, 0
        for keys, stage in ((self._chunks, "prefill.chunk"), (self._gpus, "gpu")):
            keys.add(*self._step_keys(table, d, CODE[stage], h1, h2))

    def _step_keys(self, table: pa.Table, d: Decoded, stage: int, h1: np.ndarray,
                   h2: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The service codes (the plan's own), step ids and trace hashes of a batch's valid
        rows of ``stage`` that carry a step id."""
        rows = np.flatnonzero(d.valid & (d.stage == stage))
        ids = col.int_attribute(table.column("attributes"), rows, ATTR_STEP_ID)
        rows, ids = rows[ids >= 0], ids[ids >= 0]
        service, service_values = col.codes(col.take(table.column("service"), rows))
        mine = np.array([self._services.setdefault(v, len(self._services))
                         for v in service_values] + [-1], np.int32)
        trace = d.trace[rows]
        return mine[service], ids.astype(np.int64), h1[trace], h2[trace]

    def finish(self) -> None:
        """Decide every trace's partition and the step traces' copies.

        """
        traces = _traces_reduced(self._traces)
        self._traces = []
        traces = traces.sort_by([("h1", "ascending"), ("h2", "ascending")])
        h1, h2 = traces.column("h1").to_numpy(), traces.column("h2").to_numpy()
        req = traces.column("req").to_numpy(zero_copy_only=False)
        rid = traces.column("rid")
        named = req & ~np.asarray(rid.is_null().to_numpy(zero_copy_only=False), bool)
        part = (h1 % np.uint64(self.partitions)).astype(np.int32)
        names = rid.filter(pa.array(named))
        # Hashed a slice at a time: a million request ids as Python strings at once would
        # be the largest thing the plan holds.
        part[named] = np.concatenate([np.empty(0, np.int32), *(
            _hash_mod(names.slice(at, _REDUCE_ROWS).to_numpy(zero_copy_only=False),
                      self.partitions) for at in range(0, len(names), _REDUCE_ROWS))])
        self.requests = pc.count_distinct(names).as_py() + int((req & ~named).sum())
        self._h1, self._h2, self._part = h1, h2, part
        self._copies(req)

    def _copies(self, req: np.ndarray) -> None:
        chunks, gpus = self._chunks.frame(), self._gpus.frame()
        chunks["partition"] = self._part[self._index(chunks["h1"].to_numpy(np.uint64),
                                                     chunks["h2"].to_numpy(np.uint64))]
        where = self._index(gpus["h1"].to_numpy(np.uint64), gpus["h2"].to_numpy(np.uint64))
        gpus = gpus[~req[where]].assign(at=where[~req[where]])
        gpus["own"] = self._part[gpus["at"].to_numpy()]
        pairs = gpus.merge(chunks[["service", "step", "partition"]], on=["service", "step"])
        pairs = pairs[pairs["partition"] != pairs["own"]]
        pairs = pairs[["at", "partition"]].drop_duplicates().sort_values(["at", "partition"])
        self._copy_at = pairs["at"].to_numpy(np.int64)
        self._copy_part = pairs["partition"].to_numpy(np.int64)

    def _index(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """Each trace's position in the plan, by both hashes (traces sharing the first lie
        side by side, ordered by the second); ValueError for one the survey never saw."""
        n = len(self._h1)
        at = np.searchsorted(self._h1, h1)
        last = np.searchsorted(self._h1, h1, "right")
        if n:
            # a shared first hash: the run of equal h1 searched by h2 (rarely more than one)
            shared = np.flatnonzero(last - at > 1)
            for i in shared.tolist():
                at[i] += int(np.searchsorted(self._h2[at[i]:last[i]], h2[i]))
        found = np.minimum(at, max(n - 1, 0))
        if len(h1) and (n == 0 or (at >= n).any() or (self._h1[found] != h1).any()
                        or (self._h2[found] != h2).any()):
            raise ValueError("a trace that the first pass did not see: the input changed "
                             "while it was being partitioned")
        return found

    def route(self, table: pa.Table, traces: tuple[np.ndarray, list[str]] | None = None
              ) -> Partitioning:
        """Where each row of one surveyed batch goes (``requests``: the whole input's);
        ``traces``: the batch's trace codes and values (``col.trace_codes``), when the
        caller has them."""
        if self._h1 is None:
            raise RuntimeError("route before finish")
        trace, values = col.trace_codes(table.column("trace_id")) if traces is None else traces
        if not values:
            return Partitioning(np.zeros(table.num_rows, np.int32), np.empty(0, np.int64),
                                np.empty(0, np.int32), self.requests)
        at = self._index(*_hashes(values))
        trace_part = self._part[at]
        owner = np.where(trace >= 0, trace_part[np.maximum(trace, 0)], 0).astype(np.int32)
        lo = np.searchsorted(self._copy_at, at, "left")
        hi = np.searchsorted(self._copy_at, at, "right")
        many = hi - lo
        codes = np.repeat(np.arange(len(values)), many)
        parts = self._copy_part[np.repeat(lo, many) + (np.arange(int(many.sum()))
                                                       - np.repeat(np.cumsum(many) - many,
                                                                   many))]
        copy_rows, copy_partitions = _rows_of(trace, codes, parts)
        return Partitioning(owner, copy_rows, copy_partitions.astype(np.int32), self.requests)
