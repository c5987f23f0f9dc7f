"""Device time of torch forwards: CUDA event pairs resolved into ``gpu`` spans.

A ``gpu`` span (``timing="device"``, clock ``gpu:<index>``) is the device time between two
CUDA events recorded on the current stream around a forward, mapped to the host clock
through an anchor event (docs/design.md, "Clocks"); it never starts before the host enqueued its
start event.

Threading: the traced thread only records events and appends the pair to a queue; the
resolver's daemon thread only calls ``query()`` on them (and waits on its own fresh anchor
event every 10 s), so the traced thread never synchronizes, except once for a device
without an anchor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ttft.tracer import api
from ttft.tracer.context import SpanRef

__all__ = ["Anchor", "CudaEvents", "GpuResolver"]

# the torch hooks' logger: one level setting covers the hooks and their GPU timing
logger = logging.getLogger("ttft.tracer.torch_hooks")


class CudaEvents:
    """Where a :class:`GpuResolver` gets its events: CUDA timing events on the current
    stream of the tensor's device. A test's fake has the same methods, and events with
    ``query()``, ``elapsed_time(end)`` (ms) and ``synchronize()``."""

    def device_of(self, tensor: torch.Tensor) -> int | None:
        """The CUDA device of ``tensor``; None off CUDA or while a CUDA graph is captured."""
        if tensor.is_cuda and not torch.cuda.is_current_stream_capturing():
            return tensor.device.index
        return None

    def new_event(self, device: int) -> Any:
        return torch.cuda.Event(enable_timing=True)

    def record(self, event: Any, device: int) -> None:
        event.record(torch.cuda.current_stream(device))


@dataclass(frozen=True)
class Anchor:
    """A device event whose completion was seen on the host at ``host_ns`` (epoch ns, read
    right after ``event.synchronize()``): a later event of the device maps to the host
    clock as ``host_ns + event.elapsed_time(later) * 1e6``."""

    event: Any
    host_ns: int

    def host_ns_of(self, event: Any) -> int:
        return self.host_ns + round(self.event.elapsed_time(event) * 1e6)


@dataclass(eq=False)
class _Pending:
    device: int
    anchor: Anchor
    launch_ns: int  # host epoch ns just before the start event was enqueued
    start: Any
    end: Any = None
    parent: SpanRef | None = None
    attributes: dict[str, Any] | None = None


class GpuResolver:
    """Turns start/end event pairs into ``gpu`` spans once the device has passed them.

    Args:
        events: the event source (default :class:`CudaEvents`).
        clock: host epoch ns (default ``ttft.tracer.clock_ns``).
        reanchor_interval_s: how often the resolver thread takes a fresh anchor per device,
            bounding the drift between host and device clocks.
        poll_interval_s: how often the resolver thread polls while pairs are pending.
        thread: run the resolver thread; without it, call :meth:`poll` yourself.

    Threading: :meth:`launch` and :meth:`finish` run on the traced thread and never block,
    except :meth:`launch` on a device without an anchor (one ``synchronize``, once);
    :meth:`poll` only calls ``query()``. Failures are counted in ``failed``, never raised.
    A ``gpu`` span never starts before the host enqueued its start event (``clamped_ns``
    says by how much the anchor mapping was off).
    """

    def __init__(
        self,
        events: Any = None,
        *,
        clock: Callable[[], int] = api.clock_ns,
        reanchor_interval_s: float = 10.0,
        poll_interval_s: float = 0.002,
        thread: bool = True,
    ) -> None:
        self.events = events if events is not None else CudaEvents()
        self.reanchor_interval_s = reanchor_interval_s
        self.poll_interval_s = poll_interval_s
        self.resolved = 0
        self.failed = 0
        self._clock = clock
        self._anchors: dict[int, Anchor] = {}
        self._submitted: deque[_Pending] = deque()  # traced threads append, poll() pops
        self._waiting: list[_Pending] = []  # only touched under _poll_lock
        self._poll_lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = False
        self._closed = False
        self._thread: threading.Thread | None = None
        if thread:
            self._thread = threading.Thread(target=self._run, name="ttft-gpu", daemon=True)
            self._thread.start()

    @property
    def pending(self) -> int:  # pairs submitted and not yet resolved
        return len(self._submitted) + len(self._waiting)

    def anchor(self, device: int) -> Anchor:
        """Record an anchor event on ``device``, wait for it (blocks the calling thread) and
        read the host clock right after; later launches on the device map through it."""
        event = self.events.new_event(device)
        self.events.record(event, device)
        event.synchronize()
        anchor = self._anchors[device] = Anchor(event, self._clock())
        return anchor

    def ensure_anchor(self, device: int) -> Anchor:
        """The device's current anchor, taken now if it has none."""
        return self._anchors.get(device) or self.anchor(device)

    def launch(self, device: int) -> _Pending:
        """Enqueue the start event of one forward on ``device`` (traced thread)."""
        anchor = self.ensure_anchor(device)
        start = self.events.new_event(device)
        launch_ns = self._clock()
        self.events.record(start, device)
        return _Pending(device, anchor, launch_ns, start)

    def finish(self, pending: _Pending, parent: SpanRef, attributes: dict[str, Any]) -> None:
        """Enqueue the end event and hand the pair to the resolver (traced thread)."""
        pending.end = self.events.new_event(pending.device)
        self.events.record(pending.end, pending.device)
        pending.parent = parent
        pending.attributes = attributes
        self._submitted.append(pending)
        if self._idle:
            self._wake.set()

    def poll(self) -> int:
        """Emit a ``gpu`` span for every pair whose end event the device has passed (events
        of a stream complete in order, so its start has too); returns how many."""
        with self._poll_lock:
            while self._submitted:
                self._waiting.append(self._submitted.popleft())
            still: list[_Pending] = []
            done = 0
            for pending in self._waiting:
                try:
                    if not pending.end.query():
                        still.append(pending)
                        continue
                    self._emit(pending)
                    done += 1
                except Exception:
                    self.failed += 1
                    logger.debug("ttft gpu resolver: resolving events failed", exc_info=True)
            self._waiting = still
            self.resolved += done
            return done

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the thread, then poll (sleeping between polls, never synchronizing) until
        nothing is pending or ``timeout_s`` passed; pairs left are counted in ``failed``."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            if not self.pending or time.monotonic() >= deadline:
                break
            time.sleep(self.poll_interval_s)
        with self._poll_lock:
            self.failed += self.pending
            self._submitted.clear()
            self._waiting.clear()
        if self.failed:
            logger.warning("ttft gpu resolver: %d gpu spans lost", self.failed)

    def _emit(self, pending: _Pending) -> None:
        device_start_ns = pending.anchor.host_ns_of(pending.start)
        start_ns = max(device_start_ns, pending.launch_ns)
        end_ns = max(pending.anchor.host_ns_of(pending.end), start_ns)
        attributes = pending.attributes or {}
        if start_ns > device_start_ns:  # anchor error: the device cannot start before enqueue
            attributes["clamped_ns"] = start_ns - device_start_ns
        api.record(
            "gpu",
            start_ns,
            end_ns,
            parent=pending.parent,
            clock=f"gpu:{pending.device}",
            timing="device",
            **attributes,
        )

    def _run(self) -> None:
        next_anchor_s = time.monotonic() + self.reanchor_interval_s
        while not self._closed:
            self._idle = True  # set before reading pending, so a later finish() wakes us
            wait_s = self.poll_interval_s if self.pending else next_anchor_s - time.monotonic()
            self._wake.wait(max(0.0, wait_s))
            self._idle = False
            self._wake.clear()
            self.poll()
            if time.monotonic() >= next_anchor_s and not self._closed:
                for device in list(self._anchors):
                    try:
                        self.anchor(device)
                    except Exception:
                        self.failed += 1
                        logger.debug("ttft gpu resolver: re-anchoring failed", exc_info=True)
                next_anchor_s = time.monotonic() + self.reanchor_interval_s
