"""Worker clocks: a request's rows on a host clock other than its server's, such as a
disaggregated prefill worker's (``host:<name>/prefill``), moved onto the server clock.

A worker clock moves with its server clock (the server's offset onto the client clock), and
then by an offset of its own when the two contradict causality. The rule, exactly
(docs/attribution.md, "Clocks"):

- A request's worker clocks: the host clocks (neither ``client`` nor ``gpu:*``) of its rows
  other than its server clock (the clock of its earliest-starting ``server`` span); a
  request without a ``server`` span has none.
- Per request and worker clock, the worker fits at offset ``o`` when its earliest row
  starts at or after the ``server`` span's start (the server received the request before
  handing it on), ``s0 <= w0 + o``, and its last ``prefill``/``prefill.chunk`` span ends
  at or before the server's ``first_byte`` (the first token needs the whole prompt),
  ``p1 + o <= b``: bounds ``lo = s0 - w0``, ``hi = b - p1`` (``hi`` unbounded without a
  ``first_byte`` or a prefill span on that clock: a cancelled request's ``server`` span
  may end before its prefill does, so its end bounds nothing).
- A pair's range ``[L, H]``: the offsets every request fits but the outer ``k`` at each end
  (``k = max(1, n // 100)`` of ``n`` requests): ``L`` the ``k + 1``-th largest ``lo``, ``H``
  the ``k + 1``-th smallest ``hi``. Its estimate is the middle of the range (``L`` when
  ``H`` is unbounded), its spread the range's width (negative when no offset fits them; 0
  when unbounded). The worker's time between the server's start and its own first row,
  and between its last prefill and ``first_byte``, are never negative, so the range holds
  the true offset and narrows with every request: unlike a client and a server, the two
  sides' slacks are not alike, so the midpoint of one request's bounds would be off by
  half their difference.
- Applied when at least ``MIN_REQUESTS`` requests took part, more than ``k`` do not fit at
  offset 0 and fewer do at the estimate. Unlike a client's, a worker's bounds hold on one
  host (it cannot start a request the server has not received, nor finish its prefill
  after the first token left), so more misfits than the range leaves out mean a second
  host (a server pair needs half, as a busy client's late ``sent`` breaks a few on one
  host).
- One pair per clock: a worker clock seen under several server clocks takes the pair with
  the most requests (ties: by name); a clock that is also a server clock (of requests
  with a client) is a worker only when its worker pair has more requests than its server
  pair, whose requests then move with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ttft.analysis._clock_kinds import K_PREFILL, host_clocks
from ttft.analysis.clock_offset import ClockOffset, misfit_counter, settled
from ttft.analysis.order_stats import PartSet, order_statistics

UNBOUNDED = np.iinfo(np.int64).max
"""``hi`` of a request with no prefill span on the worker clock."""
_NONE = np.iinfo(np.int64).min


def worker_bounds(
    req: np.ndarray,
    kind: np.ndarray,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    clock: np.ndarray,
    clock_values: Sequence[str],
    server_clock: np.ndarray,
    server_start: np.ndarray,
    first_byte: np.ndarray,
) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """Per (server clock, worker clock), each request's ``(lo, hi)`` (module docstring).

    Args:
        req: request of each row (-1: none, or the row is invalid).
        kind: each row's ``_clock_kinds.row_kinds`` (``K_PREFILL``: a ``prefill`` or
            ``prefill.chunk`` span).
        start_ns, end_ns, clock: the rows' times and clock codes (-1 null) into
            ``clock_values``.
        server_clock, server_start: per request, its server clock code (-1: none) and its
            ``server`` span's start.
        first_byte: per request, its ``first_byte`` (``_NONE``: none).
    """
    host = host_clocks(clock_values)
    if host.sum() < 2 or len(server_clock) == 0:  # one host clock: no row is a worker's
        return {}
    n_clock = len(clock_values) + 1
    rows = np.flatnonzero(host[clock])
    rows = rows[req[rows] >= 0]
    mine = server_clock[req[rows]]
    rows = rows[(mine >= 0) & (clock[rows] != mine)]
    if len(rows) == 0:
        return {}
    keys, inv = np.unique(req[rows] * n_clock + clock[rows], return_inverse=True)
    first = np.full(len(keys), UNBOUNDED, np.int64)
    np.minimum.at(first, inv, start_ns[rows])
    last = np.full(len(keys), _NONE, np.int64)
    pre = kind[rows] == K_PREFILL
    np.maximum.at(last, inv[pre], end_ns[rows][pre])
    r, worker = keys // n_clock, keys % n_clock
    lo = server_start[r] - first
    hi = np.where((last != _NONE) & (first_byte[r] != _NONE), first_byte[r] - last, UNBOUNDED)
    pair = server_clock[r] * n_clock + worker
    out = {}
    for code in np.unique(pair):
        hit = pair == code
        key = (str(clock_values[code // n_clock]), str(clock_values[code % n_clock]))
        out[key] = (lo[hit], hi[hit])
    return out


def worker_offsets(parts: PartSet, sizes: Mapping[tuple[str, str], int],
                   servers: Mapping[str, int]) -> list[ClockOffset]:
    """One offset per worker clock (``client_clock``: its server clock), sorted by worker
    clock: its pair with the most requests (``sizes``: each pair's over the bounds of
    every part; ties: by server clock). A clock that is also a server clock (``servers``:
    its server pair's requests) is a worker only where its worker pair has more
    requests."""
    chosen: dict[str, tuple[str, str]] = {}
    for key in sorted(sizes):
        worker = key[1]
        best = chosen.get(worker)
        if best is None or sizes[key] > sizes[best]:
            chosen[worker] = key
    return [_pair(parts, chosen[w], sizes[chosen[w]]) for w in sorted(chosen)
            if sizes[chosen[w]] > servers.get(w, 0)]


def _pair(parts: PartSet, key: tuple[str, str], n: int) -> ClockOffset:
    outer = min(max(1, n // 100), n - 1)  # requests left out at each end of the range

    def side(i: int) -> Callable[[Any], np.ndarray]:
        return lambda bounds: bounds[key][i] if key in bounds else np.empty(0, np.int64)

    found_lo, found_hi = order_statistics(parts, [side(0), side(1)],
                                          lambda m: [outer, m - 1 - outer])
    assert found_lo is not None and found_hi is not None  # the pair has n > 0 requests
    low, high = int(found_lo[n - 1 - outer]), int(found_hi[outer])
    if high == UNBOUNDED:
        guess, spread = low, 0
    else:
        guess, spread = (low + high) // 2, high - low
    return settled(*key, n, misfit_counter(parts, key), guess, spread, misfits=outer,
                   agreed=True, bounded=high != UNBOUNDED)
