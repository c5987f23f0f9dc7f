"""One exporter's thread and bounded backlog: how the recorder hands batches out.

The recorder offers each batch of finished spans to every outlet; an outlet never blocks
the caller (spans that do not fit its backlog are dropped and counted) and calls its
exporter only on its own thread, so an exporter that raises, refuses or hangs costs only
its own spans.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

# the recorder's logger: one level setting covers the recorder and its exporter threads
logger = logging.getLogger("ttft.tracer.recorder")

_DONE = threading.Event()
_DONE.set()


class Call:
    """A call to run on an outlet's thread after the batches queued before it."""

    def __init__(self, kind: str, deadline_s: float) -> None:
        self.kind = kind  # "flush" or "shutdown"
        self.deadline_s = deadline_s  # time.monotonic() by which it should return
        self.done = threading.Event()


class Outlet:
    """One exporter, its thread and its bounded backlog of batches.

    ``offer`` never blocks: spans that do not fit in the backlog are dropped and counted.
    The exporter is called only on this thread: ``export`` for each batch in order, and
    ``force_flush`` or ``shutdown`` when asked, after the batches offered before.
    """

    def __init__(self, exporter: SpanExporter, capacity: int) -> None:
        self.exporter = exporter
        self.name = type(exporter).__name__
        self.capacity = capacity
        self._items: deque[list[ReadableSpan] | Call] = deque()
        self._cond = threading.Condition()
        self._flush: Call | None = None  # a queued flush that has not started yet
        self._stopping = False
        self.pending = self.exported = self.failed = self.dropped = 0
        self._thread = threading.Thread(target=self._run, name=f"ttft-export:{self.name}",
                                        daemon=True)
        self._thread.start()

    def offer(self, spans: list[ReadableSpan]) -> None:
        with self._cond:
            room = 0 if self._stopping else max(0, self.capacity - self.pending)
            taken = spans if len(spans) <= room else spans[:room]
            self.dropped += len(spans) - len(taken)
            if taken:
                self.pending += len(taken)
                self._items.append(taken)
                self._cond.notify()

    def request(self, kind: str, deadline_s: float) -> threading.Event:
        """Queue a ``force_flush`` ("flush") or ``shutdown`` call; its event is set when it
        returned. A flush still waiting in the queue is reused (with the later deadline)."""
        with self._cond:
            if self._stopping:  # shut down (or being shut down): nothing more to do here
                return _DONE
            if kind == "flush" and self._flush is not None:
                self._flush.deadline_s = max(self._flush.deadline_s, deadline_s)
                return self._flush.done
            call = Call(kind, deadline_s)
            if kind == "flush":
                self._flush = call
            else:
                self._stopping = True
            self._items.append(call)
            self._cond.notify()
            return call.done

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items:
                    self._cond.wait()
                item = self._items.popleft()
                if item is self._flush:
                    self._flush = None
            if isinstance(item, Call):
                self._call(item)
                if item.kind == "shutdown":
                    return
                continue
            try:
                ok = self.exporter.export(item) == SpanExportResult.SUCCESS
            except Exception:
                logger.exception("ttft recorder: %s.export raised", self.name)
                ok = False
            with self._cond:
                self.pending -= len(item)
                if ok:
                    self.exported += len(item)
                else:
                    self.failed += len(item)

    def _call(self, call: Call) -> None:
        try:
            if call.kind == "flush":
                self.exporter.force_flush(max(0, int((call.deadline_s - time.monotonic()) * 1000)))
            else:
                self.exporter.shutdown()
        except Exception:
            logger.exception("ttft recorder: %s.%s raised", self.name,
                             "force_flush" if call.kind == "flush" else "shutdown")
        finally:
            call.done.set()

    def counts(self) -> tuple[int, int, int, int]:
        """(exported, dropped, failed, pending) spans of this exporter."""
        with self._cond:
            return self.exported, self.dropped, self.failed, self.pending
