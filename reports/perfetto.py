"""Chrome trace-event JSON of a span table, for ui.perfetto.dev and chrome://tracing.

Layout of the export (times in µs from the earliest exported span, 3 decimals, so ns kept):

- one process per (service, clock) for client and host clocks (client first), one per
  ``gpu:<index>`` clock; named by ``M`` events.
- a request's ``client`` and ``server`` root spans: complete ``X`` events, each on a thread
  of its own in its process ("request <short id>"), joined by a flow (``s`` on the client
  thread, ``f`` with ``bp: "e"`` on the server thread, at the server span's start).
- its other spans: nestable async ``b``/``e`` events (``cat`` "request", process-scoped
  ``id2.local`` "<short id>.<lane>"), spread over lanes so that a lane only holds disjoint or
  properly nested spans, its ``kv_transfer`` spans on lanes of their own
  ("<short id>.kv_transfer"), never among the chunks they overlap; its point events: async
  instants ``n`` on lane 0 of the same process, which Perfetto draws on that async track.
  A worker (disaggregated prefill and decode) is a (service, clock) process of its own.
- engine ``step``/``forward`` spans: ``X`` on the "engine steps" thread of their process;
  ``gpu`` spans: ``X`` on thread "device N" of their GPU process. A span that would
  partially overlap another on its thread moves to an overflow thread instead.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from os import PathLike
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ttft.reports._perfetto_check import validate_events
from ttft.tracer.schema import CLIENT_CLOCK, COLUMNS, REQUEST_STAGES, SCHEMA_VERSION

__all__ = ["EXPORTER", "perfetto_events", "perfetto_trace", "request_traces", "validate_events",
           "write_perfetto"]

EXPORTER = "ttft"
"""``otherData.exporter`` of `perfetto_trace`: the chrome importer reads span fields back."""

CAT_REQUEST = "request"
CAT_FLOW = "flow"
FLOW_NAME = "client → server"
GPU_CLOCK_PREFIX = "gpu:"
STEP_STAGES = frozenset(("step", "forward"))
_REQ_TID, _STEPS_TID, _LANE_TID = 1000, 1, 1_000_000
_TRACK = {"kv_transfer": "kv_transfer"}
"""Request stages drawn on async tracks of their own, never among the request's other
spans (a transfer overlaps the prefill chunks it follows)."""


def request_traces(table: pa.Table, requests: int | None = 100) -> list[str]:
    """Trace ids of the first ``requests`` requests (traces holding a request-level span),
    ordered by their earliest start, then id; ``None`` or 0 means all."""
    if table.num_rows == 0:
        return []
    is_req = pc.is_in(table.column("stage"), value_set=pa.array(sorted(REQUEST_STAGES)))
    ids = pc.unique(pc.filter(table.column("trace_id"), is_req))
    keep = pc.is_in(table.column("trace_id"), value_set=ids)
    first = (
        table.select(["trace_id", "start_ns"])
        .filter(keep)
        .group_by("trace_id")
        .aggregate([("start_ns", "min")])
        .sort_by([("start_ns_min", "ascending"), ("trace_id", "ascending")])
    )
    chosen = first.column("trace_id").to_pylist()
    return chosen[:requests] if requests else chosen


def perfetto_events(table: pa.Table, *, requests: int | None = 100) -> list[dict]:
    """The trace events of the first ``requests`` requests (see `request_traces`) and of
    the engine ``step``/``forward``/``gpu`` spans overlapping their overall time range.

    Server clocks are first moved onto the client clock (``analysis.clocks``). Metadata
    events come first, then the rest sorted by ``ts`` (µs from the earliest exported span);
    the list passes `validate_events`.
    """
    return _events(table, requests)[0]


def perfetto_trace(table: pa.Table, *, requests: int | None = 100) -> dict[str, Any]:
    """The trace-event JSON object `write_perfetto` writes: `perfetto_events` as
    ``traceEvents``, ``displayTimeUnit`` ms, ``baseTimeNanoseconds`` (the epoch ns of
    ``ts`` 0, absent without events) and ``otherData`` naming ttft as the exporter.

    Every span's event carries its span fields in ``args`` (``trace_id``, ``span_id``,
    ``parent_id``, ``request_id``, ``stage``, ``service``, ``clock``, ``start_ns`` and
    ``end_ns`` as recorded, ``attributes`` as an object, and ``attributes_text`` too where
    that is not strict JSON): ``ttft``'s chrome importer reads such a file back as the
    exported spans (after the clock alignment above). ``ts`` is for display: a float of µs,
    it loses ns over a wide range.
    """
    events, base_ns = _events(table, requests)
    out: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if base_ns is not None:
        out["baseTimeNanoseconds"] = base_ns
    out["otherData"] = {"exporter": EXPORTER, "schema_version": SCHEMA_VERSION}
    return out


def _events(table: pa.Table, requests: int | None) -> tuple[list[dict], int | None]:
    from ttft.analysis import clocks

    chosen = request_traces(table, requests)
    if not chosen:
        return [], None
    table = clocks.apply_offsets(table, clocks.estimate_offsets(table))
    in_req = pc.is_in(table.column("trace_id"), value_set=pa.array(chosen, pa.string()))
    req_rows = table.filter(in_req)
    lo, hi = pc.min(req_rows.column("start_ns")).as_py(), pc.max(req_rows.column("end_ns")).as_py()
    engine = pc.and_(
        pc.is_in(table.column("stage"), value_set=pa.array(["step", "forward", "gpu"])),
        pc.and_(
            pc.less_equal(table.column("start_ns"), hi),
            pc.greater_equal(table.column("end_ns"), lo),
        ),
    )
    exported = table.filter(pc.or_(in_req, pc.and_(engine, pc.invert(in_req))))
    builder = _Builder(chosen, _rows(exported))
    return builder.build(), builder.t0


def write_perfetto(path: str | PathLike[str], trace: dict[str, Any] | list[dict]) -> None:
    """Write ``trace`` (`perfetto_trace`, or a list of events: written as ``traceEvents``
    with ``displayTimeUnit`` ms) as a trace-event JSON object file.

    Raises:
        OSError: the file cannot be written.
    """
    document = {"traceEvents": trace, "displayTimeUnit": "ms"} if isinstance(trace, list) else trace
    with open(path, "w", encoding="utf-8") as out:
        json.dump(document, out, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class _Row:
    """One span, its fields in `COLUMNS` order."""

    __slots__ = ("trace", "span", "parent", "request", "name", "stage", "start", "end",
                 "clock", "service", "attributes", "end_ns")  # fmt: skip

    def __init__(self, *values: Any) -> None:
        for slot, value in zip(self.__slots__[:-1], values, strict=True):
            setattr(self, slot, value)
        self.end_ns = self.end  # as recorded (args), while
        self.end = max(self.end, self.start)  # end_before_start is drawn as a point


def _rows(table: pa.Table) -> list[_Row]:
    columns = [table.column(name).to_pylist() for name in COLUMNS]
    return [_Row(*values) for values in zip(*columns, strict=True) if None not in values[6:8]]


def _attributes(text: str | None) -> tuple[Any, bool]:
    """The attributes JSON as an object, never a NaN or infinity (invalid JSON), and whether
    it says all the text says (False: the text is not strict JSON, not an object, or repeats
    a key)."""
    repeated = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({key for key, _ in items}) < len(items):
            repeated.append(True)
        return dict(items)

    def finite(token: str) -> float:
        value = float(token)
        if not math.isfinite(value):
            raise ValueError(token)
        return value

    def constant(token: str) -> float:
        raise ValueError(token)

    if not text:
        return {}, True
    try:
        value = json.loads(text, parse_float=finite, parse_constant=constant,
                           object_pairs_hook=pairs)
    except ValueError:
        return {"raw": text}, False
    if not isinstance(value, dict):
        return {"value": value}, False
    return value, not repeated


def _short_ids(trace_ids: Sequence[str]) -> list[str]:
    """The shortest suffixes (at least 8 characters) that keep the trace ids apart."""
    width = 8
    while len({t[-width:] for t in trace_ids}) < len(set(trace_ids)):
        width += 4
    return [t[-width:] for t in trace_ids]


def _lanes(spans: Sequence[tuple[int, int]]) -> tuple[list[int], list[list[tuple[str, int]]]]:
    """Lane of each ``(start, end)``: spans visited by start (longer first on ties) go to the
    first lane where they follow or nest inside what is open. Also each lane's ``("b"|"e",
    span index)`` sequence in an order a slice stack accepts."""
    lane_of = [0] * len(spans)
    stacks: list[list[int]] = []
    seqs: list[list[tuple[str, int]]] = []
    for k in sorted(range(len(spans)), key=lambda k: (spans[k][0], -spans[k][1], k)):
        start, end = spans[k]
        for lane, stack in enumerate([*stacks, []]):
            if lane == len(stacks):
                stacks.append(stack)
                seqs.append([])
            while stack and spans[stack[-1]][1] <= start:
                seqs[lane].append(("e", stack.pop()))
            if not stack or end <= spans[stack[-1]][1]:
                stack.append(k)
                seqs[lane].append(("b", k))
                lane_of[k] = lane
                break
    for stack, seq in zip(stacks, seqs, strict=True):
        seq.extend(("e", stack.pop()) for _ in range(len(stack)))
    return lane_of, seqs


def _process_key(r: _Row) -> tuple[str, str, str]:
    """``(kind, clock, service)``: one process per GPU clock, else per (service, clock)."""
    if r.clock.startswith(GPU_CLOCK_PREFIX) or r.stage == "gpu":
        return ("gpu", r.clock, "")
    return ("client" if r.clock == CLIENT_CLOCK else "host", r.clock, r.service)


class _Builder:
    def __init__(self, chosen: list[str], rows: list[_Row]) -> None:
        self.index = {trace: i for i, trace in enumerate(chosen)}
        self.short = dict(zip(chosen, _short_ids(chosen), strict=True))
        self.rows = rows
        self.t0 = min(r.start for r in rows)
        rank = {"client": 0, "host": 1, "gpu": 2}
        keys = sorted({_process_key(r) for r in rows}, key=lambda k: (rank[k[0]], k[1], k[2]))
        self.pids = {key: pid for pid, key in enumerate(keys, start=1)}
        self.tids: dict[int, dict[Any, int]] = defaultdict(dict)
        self.used: dict[int, set[int]] = defaultdict(set)
        self.root_tid: dict[int, int] = {}
        self.names: dict[tuple[int, int], tuple[str, int]] = {}
        self.timed: list[tuple[int, dict]] = []

    def us(self, t_ns: int) -> float:
        return (t_ns - self.t0) / 1000

    def process(self, r: _Row) -> int:
        return self.pids[_process_key(r)]

    def tid(self, pid: int, key: Any, name: str, sort: int, preferred: int) -> int:
        tids, used = self.tids[pid], self.used[pid]
        if key not in tids:
            tid = preferred
            while tid in used:
                tid += 1
            tids[key] = tid
            used.add(tid)
            self.names[(pid, tid)] = (name, sort)
        return tids[key]

    def request_tid(self, pid: int, trace: str, lane: int = 0) -> int:
        i, short = self.index[trace], self.short[trace]
        name = f"request {short}" + (f" ({lane + 1})" if lane else "")
        return self.tid(pid, ("request", trace, lane), name, 1 + i, _REQ_TID + i + lane)

    def args(self, r: _Row) -> dict:
        out = {"stage": r.stage, "trace_id": r.trace, "span_id": r.span,
               "parent_id": r.parent, "request_id": r.request, "service": r.service,
               "clock": r.clock, "start_ns": r.start, "end_ns": r.end_ns}
        out = {k: v for k, v in out.items() if v is not None}
        attributes, exact = _attributes(r.attributes)
        if not exact:  # not strict JSON (NaN, a trailing comma): the text as it was, too
            out["attributes_text"] = r.attributes
        return {**out, "attributes": attributes}

    def emit(self, t_ns: int, event: dict) -> None:
        self.timed.append((t_ns, {"ph": event.pop("ph"), "ts": self.us(t_ns), **event}))

    def build(self) -> list[dict]:
        threads: dict[tuple[int, str, Any], list[_Row]] = defaultdict(list)
        asyncs: dict[tuple[int, str, str], list[_Row]] = defaultdict(list)
        points: list[_Row] = []
        roots: dict[tuple[str, str], _Row] = {}
        for r in sorted(self.rows, key=lambda r: (r.start, -r.end)):
            if r.trace in self.index and r.stage in ("client", "server"):
                roots.setdefault((r.trace, r.stage), r)
        root_rows = {id(r) for r in roots.values()}
        for r in self.rows:
            pid = self.process(r)
            if r.trace in self.index and r.stage == "event":
                points.append(r)
            elif _process_key(r)[0] == "gpu":
                threads[(pid, "device", None)].append(r)
            elif r.stage in STEP_STAGES:
                threads[(pid, "steps", None)].append(r)
            elif id(r) in root_rows:
                threads[(pid, "request", r.trace)].append(r)
            elif r.trace in self.index:
                asyncs[(pid, r.trace, _TRACK.get(r.stage, ""))].append(r)
        for key in sorted(threads, key=lambda k: (k[0], k[1], self.index.get(k[2], -1))):
            self.complete(key, threads[key])
        for (pid, trace, track), spans in asyncs.items():
            self.nested(pid, trace, spans, track)
        for r in points:
            pid = self.process(r)
            self.emit(r.start, {"ph": "n", "name": r.name, "cat": CAT_REQUEST, "pid": pid,
                                "tid": self.request_tid(pid, r.trace),
                                "id2": {"local": f"{self.short[r.trace]}.0"},
                                "args": self.args(r)})  # fmt: skip
        for trace in self.index:
            self.flow(roots.get((trace, "client")), roots.get((trace, "server")))
        self.timed.sort(key=lambda item: item[0])
        return self.metadata() + [event for _, event in self.timed]

    def complete(self, key: tuple[int, str, Any], spans: list[_Row]) -> None:
        pid, kind, trace = key
        lane_of, seqs = _lanes([(r.start, r.end) for r in spans])
        for lane, seq in enumerate(seqs):
            if kind == "request":
                tid = self.request_tid(pid, trace, lane)
            elif kind == "steps":
                name = "engine steps" + (f" (overflow {lane})" if lane else "")
                tid = self.tid(pid, ("steps", lane), name, 0, _STEPS_TID if not lane else _LANE_TID)
            else:
                clock = spans[seq[0][1]].clock
                device = (
                    clock[len(GPU_CLOCK_PREFIX) :] if clock.startswith(GPU_CLOCK_PREFIX) else ""
                )
                index = int(device) if device.isdigit() else 0
                name = f"device {device or clock}" + (f" (overflow {lane})" if lane else "")
                tid = self.tid(pid, ("device", lane), name, lane, index if not lane else _LANE_TID)
            for phase, k in seq:
                if phase == "b":
                    r = spans[k]
                    self.root_tid[id(r)] = tid
                    self.emit(r.start, {"ph": "X", "name": r.name, "cat": r.stage, "pid": pid,
                                        "tid": tid, "dur": (r.end - r.start) / 1000,
                                        "args": self.args(r)})  # fmt: skip

    def nested(self, pid: int, trace: str, spans: list[_Row], track: str = "") -> None:
        """A request's spans in one process as async lanes ``<short id>.<lane>``, or of a
        track of their own (``kv_transfer``) as ``<short id>.<track>[.<lane>]``."""
        tid = self.request_tid(pid, trace)
        _, seqs = _lanes([(r.start, r.end) for r in spans])
        for lane, seq in enumerate(seqs):
            name = f"{track}.{lane}" if track and lane else track or str(lane)
            ident = {"local": f"{self.short[trace]}.{name}"}
            for phase, k in seq:
                r = spans[k]
                event = {"ph": phase, "name": r.name, "cat": CAT_REQUEST, "pid": pid, "tid": tid,
                         "id2": ident}  # fmt: skip
                if phase == "b":
                    event["args"] = self.args(r)
                self.emit(r.start if phase == "b" else r.end, event)

    def flow(self, client: _Row | None, server: _Row | None) -> None:
        """Flow from the client root to the server root, bound to the enclosing slices."""
        if client is None or server is None:
            return
        if client.end <= client.start or server.end <= server.start:
            return  # a flow binds to a slice that contains its ts; a point contains none
        flow_id = self.index[client.trace] + 1
        for phase, r, t_ns in (
            ("s", client, min(max(server.start, client.start), client.end - 1)),
            ("f", server, server.start),
        ):
            event = {"ph": phase, "name": FLOW_NAME, "cat": CAT_FLOW, "id": flow_id,
                     "pid": self.process(r), "tid": self.root_tid[id(r)]}  # fmt: skip
            if phase == "f":
                event["bp"] = "e"
            self.emit(t_ns, event)

    def metadata(self) -> list[dict]:
        out: list[dict] = []
        for sort, ((kind, clock, service), pid) in enumerate(self.pids.items()):
            if kind == "gpu":
                name = clock if clock.startswith(GPU_CLOCK_PREFIX) else f"gpu · {clock}"
            else:
                name = f"{service} · {clock}"
            out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                        "args": {"sort_index": sort}})  # fmt: skip
        for (pid, tid), (name, sort) in sorted(self.names.items()):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": name}})  # fmt: skip
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": sort}})  # fmt: skip
        return out
