"""The load a run offered and the load it achieved, from its own event times.

One definition serves every command that sends load (``ttft trace``, ``ttft demo`` and its
capacity probe), so their figures can be compared:

- the **offered** rate is the arrival schedule's: ``(n - 1) / (last - first arrival)``, the
  inverse of its mean gap. It is the rate the run really offered, not the nominal one it
  was drawn at (200 seeded Poisson gaps can average 12% longer than ``1/rate``);
- the **achieved** rate counts completions the same way: ``(completed - 1) / (last - first
  completion)``. A server that keeps up completes requests as they arrive (shifted by their
  latency, which cancels), so the two agree; one that does not completes them at its own
  capacity, and the achieved rate falls short of the offered one;
- a **steady rate** (:func:`steady_rate`) is a closed loop's completions per second after
  its warm-up, with the spread of that figure from batch means.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ttft.collectors.loadgen import RequestResult

__all__ = ["KEPT_UP_FRACTION", "LoadClock", "LoadRates", "RateEstimate", "offered_rate",
           "steady_rate"]

KEPT_UP_FRACTION = 0.85
"""An open-loop run whose achieved rate is below this share of its offered rate did not keep
up: requests queued behind each other, and their TTFT includes that queueing."""


def offered_rate(arrival_offsets_s: Sequence[float]) -> float | None:
    """The schedule's arrival rate, ``(n - 1) / (last - first)`` in requests per second;
    None for fewer than two arrivals or all at one instant (a burst or a closed loop, which
    offer no rate)."""
    if len(arrival_offsets_s) < 2:
        return None
    span_s = max(arrival_offsets_s) - min(arrival_offsets_s)
    return (len(arrival_offsets_s) - 1) / span_s if span_s > 0 else None


@dataclass(frozen=True)
class LoadRates:
    """What a run offered and what it achieved.

    Attributes:
        requests: requests sent.
        completed: requests that completed (a failed one is not counted).
        load_s: from the first request sent to the last one completed (0 without any).
        offered_rate_per_s: :func:`offered_rate` of the schedule; None for a closed loop or
            a burst.
        achieved_rate_per_s: ``(completed - 1) / (last - first completion)``; None with
            fewer than two completions at distinct times.
    """

    requests: int
    completed: int
    load_s: float
    offered_rate_per_s: float | None
    achieved_rate_per_s: float | None

    def kept_up(self) -> bool | None:
        """False when the achieved rate is below ``KEPT_UP_FRACTION`` of the offered rate;
        None when there is no offered rate to compare with, or no achieved one."""
        if self.offered_rate_per_s is None or self.achieved_rate_per_s is None:
            return None
        return self.achieved_rate_per_s >= KEPT_UP_FRACTION * self.offered_rate_per_s


class LoadClock:
    """Times a load from :func:`loadgen.run`'s callbacks, then calls the caller's own: when
    the first request was sent and when each one completed (a failed one is kept out of the
    completions; the first failure's message is kept). Called on the event loop's thread."""

    def __init__(self, on_sent: Callable[[int], None] | None = None,
                 on_result: Callable[[RequestResult], None] | None = None) -> None:
        self._sent, self._result = on_sent, on_result
        self.first_sent_ns: int | None = None
        self.completion_ns: list[int] = []
        self.sent = 0
        self.first_error: str | None = None

    def on_sent(self, index: int) -> None:
        if self.first_sent_ns is None:
            self.first_sent_ns = time.perf_counter_ns()
        self.sent += 1
        if self._sent is not None:
            self._sent(index)

    def on_result(self, result: RequestResult) -> None:
        if result.error is None:
            self.completion_ns.append(time.perf_counter_ns())
        elif self.first_error is None:
            self.first_error = result.error
        if self._result is not None:
            self._result(result)

    @property
    def completed(self) -> int:
        return len(self.completion_ns)

    @property
    def load_s(self) -> float:
        """From the first request sent to the last completion (0 before either)."""
        if self.first_sent_ns is None or not self.completion_ns:
            return 0.0
        return (self.completion_ns[-1] - self.first_sent_ns) / 1e9

    def rates(self, arrival_offsets_s: Sequence[float] | None) -> LoadRates:
        """The run's :class:`LoadRates`; ``arrival_offsets_s`` None (or all equal) for a
        closed loop or a burst."""
        achieved = None
        if len(self.completion_ns) >= 2:
            span_ns = self.completion_ns[-1] - self.completion_ns[0]
            achieved = (len(self.completion_ns) - 1) / (span_ns / 1e9) if span_ns > 0 else None
        offered = offered_rate(arrival_offsets_s) if arrival_offsets_s is not None else None
        return LoadRates(self.sent, self.completed, self.load_s, offered, achieved)


@dataclass(frozen=True)
class RateEstimate:
    """A steady completion rate and how sure it is.

    Attributes:
        rate_per_s: completions per second after the warm-up.
        spread_per_s: half-width of its 95% confidence interval (batch means, Student t).
        completions: completions the rate counts (warm-up excluded).
        seconds: the time they span.
    """

    rate_per_s: float
    spread_per_s: float
    completions: int
    seconds: float

    @property
    def relative_spread(self) -> float:
        return self.spread_per_s / self.rate_per_s


_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086)
"""Student t's 97.5% quantile for 1..20 degrees of freedom (beyond: 2.0, within 2.5%)."""


def steady_rate(completion_ns: Sequence[int], *, skip: int, batch: int,
                min_batches: int = 5) -> RateEstimate | None:
    """A closed loop's steady completion rate, warm-up excluded, with its spread.

    The first ``skip`` completions are the warm-up (a fresh client and server are slow at
    first) and the ``skip``-th is the clock's start. The intervals after it are cut into
    batches of ``batch`` consecutive ones (the newest ``B * batch``; one round of a closed
    loop with ``batch`` in flight, so that requests batched into one step fall into one
    batch); each batch's mean interval is one sample, and the rate's spread is the 95%
    interval of their mean (method of batch means), carried over to the rate by the delta
    method (relative spreads equal, good while the spread is small). Completions
    are correlated, so a bootstrap over single intervals would claim too little spread.

    Returns:
        None with fewer than ``min_batches`` batches (``min_batches >= 2``).
    """
    if batch < 1 or min_batches < 2 or skip < 1:
        raise ValueError(f"need skip >= 1, batch >= 1, min_batches >= 2; got {skip}, {batch}, "
                         f"{min_batches}")
    times_ns = list(completion_ns)[skip - 1:]
    batches = (len(times_ns) - 1) // batch
    if batches < min_batches:
        return None
    times_ns = times_ns[len(times_ns) - 1 - batches * batch:]
    means_s = [(times_ns[(i + 1) * batch] - times_ns[i * batch]) / 1e9 / batch
               for i in range(batches)]
    mean_s = statistics.fmean(means_s)
    if mean_s <= 0:
        return None
    t = _T975[batches - 2] if batches - 1 <= len(_T975) else 2.0
    half_s = t * statistics.stdev(means_s) / math.sqrt(batches)
    rate = 1.0 / mean_s
    # the rate's relative spread is the mean interval's (delta method)
    return RateEstimate(rate, rate * half_s / mean_s, batches * batch, batches * batch * mean_s)
