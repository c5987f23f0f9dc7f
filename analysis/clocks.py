"""Client/server clock offsets by the midpoint rule, and moving server spans onto the client clock.

docs/design.md ("Clocks"): one offset per (client clock, server clock) pair, estimated over all
requests with the midpoint rule of Jaeger's clock-skew adjuster, applied to every span of
that server clock and reported. The rule, exactly (docs/attribution.md, "Clocks"):

- Client side: rows whose ``clock`` is ``client``; the server clock of a request is the
  ``clock`` of its earliest-starting ``server`` span. Requests are grouped as in
  ``assemble`` (traces sharing a ``request_id`` are one request).
- Per request, the client interval ``[c0, c1]`` and the server interval ``[s0, s1]`` that
  it must contain: ``c0`` is the client's ``sent`` event (else the ``client`` span's start)
  and ``s0`` the ``server`` span's start; ``[c1, s1]`` is ``[first_token, first_byte]``
  when the request has both events (each marks the first body chunk carrying a token, one
  received, one handed over), else ``[client end, server end]`` (the last byte). The
  client's ``first_chunk`` is not used: for a chat stream it is the role-only chunk the
  server writes before ``first_byte``.
- The server interval fits at offset ``o`` when ``c0 <= s0 + o`` and ``s1 + o <= c1``; the
  request's estimate is the ``o`` that centres it, ``((c0 - s0) + (c1 - s1)) / 2``, exact
  when the network delay is the same both ways.
- A pair's estimate is the median of its requests' estimates (``spread``: their
  interquartile range). Like Jaeger, which adjusts only a child that does not fit in its
  parent, the estimate is applied only when the clocks contradict causality and the
  requests agree on the remedy: at least ``MIN_REQUESTS`` requests took part, more than half
  of them do not fit at offset 0, fewer do not fit at the estimate, and the estimate's
  magnitude exceeds the spread. Otherwise the offset is 0 (one host, or clocks already
  consistent; a clock name says nothing about its host, and on one host a client that
  records ``sent`` late makes a minority of requests look shifted).

A worker clock (a request's host clock other than its server's: a disaggregated prefill
worker's) moves with its server clock, then by an offset of its own onto it
(``analysis._worker_clocks``). Both decide a pair's offset by ``analysis.clock_offset``
(`ClockOffset`, ``MIN_REQUESTS``, ``settled``).

A ``gpu:<index>`` clock is mapped to the host clock of the process that recorded it
(docs/design.md), so it moves with that host clock: the one host clock (neither ``client`` nor
``gpu:*``) among the rows of the same trace and service (the engine trace of its step and
forward), else the one host clock of that service in the table; otherwise it stays.

Pure functions over Arrow tables and numpy arrays; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis import _column_arrays as col
from ttft.analysis._clock_kinds import (
    GPU_CLOCK_PREFIX,
    K_CLIENT,
    K_FIRST_BYTE,
    K_FIRST_TOKEN,
    K_NONE,
    K_PREFILL,
    K_SENT,
    K_SERVER,
    clock_kinds,
    host_clocks,
)
from ttft.analysis._grouping import Decoded, decode, group
from ttft.analysis._worker_clocks import worker_bounds, worker_offsets
from ttft.analysis.clock_offset import ClockOffset, misfit_counter, settled
from ttft.analysis.order_stats import InMemory, PartSet, percentiles
from ttft.tracer.schema import CLIENT_CLOCK

_NONE = np.iinfo(np.int64).min

Bounds = dict[str | tuple[str, str], tuple[np.ndarray, np.ndarray]]
"""Per server clock, each request's bounds ``(lo, hi)`` on its offset; per (server clock,
worker clock) the same for the worker (``analysis._worker_clocks``): what the offsets need
from a set of requests, so that parts of a trace (a dataset's partitions, each holding
whole requests) are estimated together exactly as the whole would be."""


def offsets_from_bounds(parts: Sequence[Bounds] | PartSet) -> list[ClockOffset]:
    """The offsets of every pair over the requests of all ``parts`` (their `Bounds`, in
    memory or a `PartSet` of them: a dataset's partitions' bounds spilled to disk, read
    back a part at a time, so that the process holds none of the requests' bounds): the
    server clocks' (sorted by server clock), then the worker clocks'
    (`_worker_clocks.worker_offsets`). The same figures either way: percentiles and order
    statistics over the parts (``order_stats``) equal numpy's of the requests together."""
    if not isinstance(parts, PartSet):
        parts = InMemory(parts)
    sizes: dict[str | tuple[str, str], int] = {}
    for found in parts.map(lambda b: {key: len(lo) for key, (lo, _) in b.items()}):
        for key, n in found.items():
            sizes[key] = sizes.get(key, 0) + n
    servers = [_pair(parts, name, sizes[name])
               for name in sorted(k for k in sizes if isinstance(k, str))]
    workers = worker_offsets(parts, {key: n for key, n in sizes.items() if isinstance(key, tuple)},
                             {o.server_clock: o.requests for o in servers})
    taken = {o.server_clock for o in workers}  # those clocks are workers, not servers
    return [o for o in servers if o.server_clock not in taken] + workers


def bounds(
    req: np.ndarray,
    n_req: int,
    kind: np.ndarray,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    clock: np.ndarray,
    clock_values: Sequence[str],
) -> Bounds:
    """The `Bounds` of the requests of decoded columns.

    Args:
        req: request of each row (-1: none, or the row is invalid).
        n_req: number of requests.
        kind: ``_clock_kinds.row_kinds`` of each row.
        start_ns, end_ns, clock: the rows' times and clock codes into ``clock_values``.
    """
    use = (req >= 0) & (kind != K_NONE) & (kind != K_PREFILL)  # prefill rows: the workers'
    rows = np.flatnonzero(use)
    r, k, t0, t1 = req[rows], kind[rows], start_ns[rows], end_ns[rows]
    client0, client1, _ = _earliest(r[k == K_CLIENT], t0[k == K_CLIENT], t1[k == K_CLIENT], n_req)
    srows = k == K_SERVER
    server0, server1, s_clock = _earliest(r[srows], t0[srows], t1[srows], n_req, clock[rows][srows])
    sent, first_token, first_byte = (
        _first(r[k == want], t0[k == want], n_req) for want in (K_SENT, K_FIRST_TOKEN, K_FIRST_BYTE)
    )
    ok = (client0 != _NONE) & (server0 != _NONE)
    c0 = np.where(sent != _NONE, sent, client0)
    events = (first_token != _NONE) & (first_byte != _NONE)
    c1 = np.where(events, first_token, client1)
    s1 = np.where(events, first_byte, server1)
    lo = (c0 - server0)[ok]
    hi = (c1 - s1)[ok]
    clocks = s_clock[ok]
    out: Bounds = {}
    for code in np.unique(clocks):
        mine = clocks == code
        out[str(clock_values[code])] = (lo[mine], hi[mine])
    out.update(worker_bounds(req, kind, start_ns, end_ns, clock, clock_values, s_clock,
                             server0, first_byte))
    return out


def _pair(parts: PartSet, server_clock: str, n: int) -> ClockOffset:
    def per_request(bounds: Bounds) -> np.ndarray:
        if server_clock not in bounds:
            return np.empty(0, np.float64)
        lo, hi = bounds[server_clock]
        return (lo.astype(np.float64) + hi.astype(np.float64)) / 2

    ((q25, median, q75),) = percentiles(parts, [per_request], [25, 50, 75])
    guess, spread = int(round(median)), int(round(q75 - q25))
    return settled(CLIENT_CLOCK, server_clock, n, misfit_counter(parts, server_clock), guess,
                   spread, misfits=n // 2, agreed=spread < abs(guess))


def _first(req: np.ndarray, t: np.ndarray, n_req: int) -> np.ndarray:
    out = np.full(n_req, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(out, req, t)
    return np.where(out == np.iinfo(np.int64).max, _NONE, out)


def _earliest(
    req: np.ndarray, t0: np.ndarray, t1: np.ndarray, n_req: int, clock: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start, end (and clock code) of each request's earliest-starting span."""
    order = np.lexsort((t0, req))
    req, t0, t1 = req[order], t0[order], t1[order]
    head = np.ones(len(req), bool)
    head[1:] = req[1:] != req[:-1]
    start = np.full(n_req, _NONE, np.int64)
    end = np.full(n_req, _NONE, np.int64)
    codes = np.full(n_req, -1, np.int64)
    start[req[head]], end[req[head]] = t0[head], t1[head]
    if clock is not None:
        codes[req[head]] = clock[order][head]
    return start, end, codes


def row_shift(
    clock: np.ndarray,
    clock_values: Sequence[str],
    offsets: Sequence[ClockOffset],
    trace: Callable[[], np.ndarray],
    service: Callable[[], np.ndarray],
) -> np.ndarray | None:
    """The ns to add to each row's times, or None when no row moves.

    Args:
        clock: clock codes (-1 null) into ``clock_values``.
        offsets: the pairs; one per server clock at most.
        trace, service: give the rows' trace / service codes (called only when a
            ``gpu:*`` clock must be mapped to its host).

    Raises:
        ValueError: two offsets for one server clock.
    """
    found = row_shift_parts(clock, clock_values, offsets, trace, service)
    return None if found is None else found[0]


def clock_shifts(offsets: Sequence[ClockOffset]) -> dict[str, int]:
    """The ns ``offsets`` move each clock's rows by (a worker clock's with its server
    clock's, then by its own), for the clocks that move (none: nothing moves); the same
    shifts move every row the same way (`row_shift`).

    Raises:
        ValueError: two offsets for one server clock.
    """
    by_clock: dict[str, int] = {}
    # Server clocks first; a worker clock moves with its server clock, then by its own.
    for o in sorted(offsets, key=lambda o: o.client_clock != CLIENT_CLOCK):
        if o.server_clock in by_clock:
            raise ValueError(f"two clock offsets for server clock {o.server_clock!r}")
        by_clock[o.server_clock] = o.offset_ns + (
            0 if o.client_clock == CLIENT_CLOCK else by_clock.get(o.client_clock, 0))
    return {clock: ns for clock, ns in by_clock.items() if ns}


def row_shift_parts(
    clock: np.ndarray,
    clock_values: Sequence[str],
    offsets: Sequence[ClockOffset],
    trace: Callable[[], np.ndarray],
    service: Callable[[], np.ndarray],
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """`row_shift`, and which ``gpu:*`` rows found no host clock in their trace (None: none),
    so took their service's in the table, which a part of it may not show: ``assemble``
    moves their joined copies with their chunks instead."""
    by_clock = clock_shifts(offsets)
    if not by_clock:
        return None
    per_value = np.array([by_clock.get(v, 0) for v in clock_values] + [0], np.int64)
    shift = per_value[clock]
    gpu_values = [i for i, v in enumerate(clock_values) if v.startswith(GPU_CLOCK_PREFIX)]
    is_gpu = col.among(clock, gpu_values, len(clock_values))
    if not is_gpu.any():
        return shift, None
    is_host = host_clocks(clock_values)[clock]
    # Host clocks ranked by name, so the choice never depends on row order.
    rank = np.argsort(np.argsort(np.asarray(clock_values, dtype=object)))
    by_rank = np.argsort(np.asarray(clock_values, dtype=object))
    trace_codes, service_codes = trace(), service()
    n_service = int(service_codes.max(initial=0)) + 2

    def by_trace(rows: np.ndarray) -> np.ndarray:
        return trace_codes[rows].astype(np.int64) * n_service + service_codes[rows] + 1

    def by_service(rows: np.ndarray) -> np.ndarray:
        return service_codes[rows].astype(np.int64)

    # First the host clock of the gpu row's own trace and service, then of its service.
    gpu_rows = np.flatnonzero(is_gpu)
    gpu_trace = np.zeros(int(trace_codes.max(initial=0)) + 2, bool)
    gpu_trace[trace_codes[gpu_rows]] = True
    hosts = np.flatnonzero(is_host & gpu_trace[trace_codes])
    home = _only_host(by_trace(gpu_rows), by_trace(hosts), rank[clock[hosts]])
    left = home < 0
    untraced = None
    if left.any():
        untraced = np.zeros(len(clock), bool)
        untraced[gpu_rows[left]] = True
        hosts = np.flatnonzero(is_host)
        home[left] = _only_host(by_service(gpu_rows[left]), by_service(hosts), rank[clock[hosts]])
    found = home >= 0
    shift[gpu_rows[found]] = per_value[by_rank[home[found]]]
    return shift, untraced


def _only_host(want: np.ndarray, have: np.ndarray, host_rank: np.ndarray) -> np.ndarray:
    """For each key in ``want``: the rank of the one host clock among rows of that key in
    ``have`` (ranks ``host_rank``); -1 where there is none or more than one."""
    keys, inv = np.unique(want, return_inverse=True)
    pos = np.searchsorted(keys, have)
    hit = pos < len(keys)
    hit[hit] = keys[pos[hit]] == have[hit]
    big = np.iinfo(np.int64).max
    low = np.full(len(keys), big, np.int64)
    high = np.full(len(keys), -1, np.int64)
    np.minimum.at(low, pos[hit], host_rank[hit])
    np.maximum.at(high, pos[hit], host_rank[hit])
    one = (low == high) & (high >= 0)
    return np.where(one, low, -1)[inv]


def estimate_offsets(table: pa.Table) -> list[ClockOffset]:
    """One `ClockOffset` per clock pair of a span table (``tracer.schema.SPAN_SCHEMA``), its
    requests grouped as ``assemble`` groups them: `offsets_from_bounds`."""
    return offsets_from_bounds([table_bounds(table)])


def table_bounds(table: pa.Table, d: Decoded | None = None) -> Bounds:
    """The `Bounds` of a span table's requests, grouped as ``assemble`` groups them; ``d``
    is the table decoded (``analysis._grouping.decode``), if it was."""
    d = decode(table) if d is None else d
    g = group(table, d)
    return bounds(g.row_req, g.n_req, clock_kinds(d), d.start, d.end, d.clock_raw,
                  d.clock_values)


def apply_offsets(table: pa.Table, offsets: Sequence[ClockOffset]) -> pa.Table:
    """``table`` with ``start_ns``/``end_ns`` of every row on a server clock (and on the
    ``gpu:*`` clocks of that host) moved by its pair's ``offset_ns``; the same table when
    no row moves."""
    clock, clock_values = col.codes(table.column("clock"))
    shift = row_shift(
        clock,
        clock_values,
        offsets,
        lambda: col.trace_codes(table.column("trace_id"))[0],
        lambda: col.codes(table.column("service"))[0],
    )
    if shift is None or table.num_rows == 0:
        return table
    for name in ("start_ns", "end_ns"):
        column = table.column(name)
        bounds = np.cumsum([len(c) for c in column.chunks])[:-1]
        moves = pa.chunked_array(
            [pa.array(s, pa.int64()) for s in np.split(shift, bounds)], type=pa.int64()
        )
        index = table.schema.get_field_index(name)
        table = table.set_column(index, table.schema.field(name), pc.add(column, moves))
    return table
