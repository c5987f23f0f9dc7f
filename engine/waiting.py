"""The engine's waiting queue (``WaitingQueue``) and its refusal (``QueueFull``).

Threading: the asyncio side appends (``put``); the engine's worker thread reads, takes
and, with recompute preemption, puts preempted requests back at the front
(``put_front``). One lock guards every access, held only for the list operation itself.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from ttft.engine.faults import delay_ns
from ttft.engine.stream import RequestState
from ttft.tracer import clock_ns

__all__ = ["QueueFull", "WaitingQueue"]


class QueueFull(RuntimeError):
    """The waiting queue holds ``max_queue`` requests; retry later (HTTP 429)."""


class WaitingQueue:
    """Requests waiting for admission, in the order they are to be admitted."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._reqs: deque[RequestState] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._reqs)

    def put(self, req: RequestState, ready_ns: int) -> None:
        """Append ``req``, which arrived at ``ready_ns`` (its ``queue`` span begins there;
        an injected ``queue`` delay sets when it may be admitted).

        Raises:
            QueueFull: ``max_queue`` requests are waiting.
        """
        with self._lock:
            if len(self._reqs) >= self.max_queue:
                raise QueueFull(f"waiting queue full ({self.max_queue} requests); retry later")
            req.arrival_ns = ready_ns
            req.eligible_ns = req.arrival_ns + delay_ns(req.delays_ms, "queue")
            self._reqs.append(req)

    def put_front(self, req: RequestState) -> None:
        """Put a preempted ``req`` first, beyond ``max_queue`` if need be (it was admitted
        once; refusing it now would fail a request the server already answers)."""
        with self._lock:
            self._reqs.appendleft(req)

    def head(self, slots: int) -> list[tuple[RequestState, bool]]:
        """The waiting requests up to the ``slots``-th that may be admitted now (no plan
        admits more), each with whether it may (an injected queue delay holds it back)."""
        now_ns, found = clock_ns(), 0
        out: list[tuple[RequestState, bool]] = []
        with self._lock:
            for req in self._reqs:
                if found >= slots:
                    break
                eligible = req.eligible_ns <= now_ns
                out.append((req, eligible))
                found += eligible
        return out

    def take(self, reqs: Iterable[RequestState]) -> None:
        """Remove ``reqs`` (each waiting now)."""
        with self._lock:
            for req in reqs:
                self._reqs.remove(req)

    def discard(self, req: RequestState) -> bool:
        """Remove ``req`` if it waits; whether it did."""
        with self._lock:
            if req not in self._reqs:
                return False
            self._reqs.remove(req)
            return True

    def take_cancelled(self) -> list[RequestState]:
        """Remove and return the cancelled requests."""
        with self._lock:
            gone = [r for r in self._reqs if r.cancelled]
            for req in gone:
                self._reqs.remove(req)
        return gone

    def take_all(self) -> list[RequestState]:
        """Remove and return every request."""
        with self._lock:
            reqs, self._reqs = list(self._reqs), deque()
        return reqs

    def next_due_s(self) -> float | None:
        """Seconds until the earliest request held back by a queue delay may be admitted
        (0 when one may be now); None when none waits."""
        with self._lock:
            due = [r.eligible_ns for r in self._reqs if not r.cancelled]
        return max(0.0, (min(due) - clock_ns()) / 1e9) if due else None
