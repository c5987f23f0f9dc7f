"""One clock pair's offset (`ClockOffset`) and the rule that decides whether an estimate is
applied (`settled`), shared by the server pairs (``analysis.clocks``) and the worker pairs
(``analysis._worker_clocks``); and the times an offset may move (`TIME_LIMIT_NS`), which
``analysis._grouping`` keeps rows inside."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ttft.analysis.order_stats import PartSet

MIN_REQUESTS = 10
"""Fewest requests with both a client and a server interval before an offset is applied."""
TIME_LIMIT_NS = 1 << 62
"""Times must lie strictly between ``-TIME_LIMIT_NS`` and ``TIME_LIMIT_NS`` (the years 1824
to 2116) to be used: then every difference of two times, and every time moved by an
offset, fits in int64. Rows outside are dropped as ``missing_field``."""


@dataclass(frozen=True)
class ClockOffset:
    """The offset of one (client clock, server clock) pair, or (server clock, worker clock)
    pair (``analysis._worker_clocks``: read server for client and worker for server).

    Attributes:
        client_clock: the client's clock (``client``).
        server_clock: the server's clock, e.g. ``host:gpu-box-3``.
        offset_ns: added to every time on ``server_clock`` (and its ``gpu:*`` clocks) to
            put it on ``client_clock`` (a worker's also move by its server's); 0 when the
            estimate is not applied.
        estimate_ns: the median of the per-request estimates, applied or not.
        spread_ns: interquartile range of the per-request estimates.
        requests: requests with both a client and a server interval on this pair.
        violations_before: requests whose server interval does not fit inside the client
            interval at offset 0.
        violations_after: the same at ``offset_ns``.
        bounded: False for a worker pair whose range no first byte bounds (spread 0, not exact).
    """

    client_clock: str
    server_clock: str
    offset_ns: int
    estimate_ns: int
    spread_ns: int
    requests: int
    violations_before: int
    violations_after: int
    bounded: bool = True

    @property
    def applied(self) -> bool:
        return self.offset_ns != 0


def in_range(t_ns: np.ndarray) -> np.ndarray:
    """Which times lie strictly inside ``±TIME_LIMIT_NS``."""
    return (t_ns > -TIME_LIMIT_NS) & (t_ns < TIME_LIMIT_NS)


def misfit_counter(parts: PartSet, key: Any) -> Callable[[int], int]:
    """How many requests of the pair ``key`` do not fit at an offset (``lo > offset`` or
    ``hi < offset``), over the bounds of every part (each a ``{key: (lo, hi)}``; one pass
    a call)."""
    def count(offset: int) -> int:
        def one(bounds: Any) -> int:
            if key not in bounds:
                return 0
            lo, hi = bounds[key]
            return int(((lo > offset) | (hi < offset)).sum())

        return sum(parts.map(one))

    return count


def settled(reference: str, clock: str, n: int, misfit: Callable[[int], int], guess: int,
            spread: int, *, misfits: int, agreed: bool, bounded: bool = True) -> ClockOffset:
    """The pair's `ClockOffset` at the estimate ``guess``, over its ``n`` requests
    (``misfit(offset)``: how many do not fit at an offset, `misfit_counter`): applied when at least
    `MIN_REQUESTS` requests took part, more than ``misfits`` do not fit at offset 0
    (``lo > 0`` or ``hi < 0``), fewer do at ``guess``, the requests ``agreed`` on it, and a
    moved time stays inside int64."""
    before = misfit(0)
    at_guess = misfit(guess)
    applied = (n >= MIN_REQUESTS and before > misfits and at_guess < before and agreed
               and abs(guess) < TIME_LIMIT_NS)
    return ClockOffset(
        client_clock=reference,
        server_clock=clock,
        offset_ns=guess if applied else 0,
        estimate_ns=guess,
        spread_ns=spread,
        requests=n,
        violations_before=before,
        violations_after=at_guess if applied else before,
        bounded=bounded,
    )
