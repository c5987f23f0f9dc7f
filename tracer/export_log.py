"""One log line when an exporter's destination goes away and one when it is back, instead of
the exporter's own warning (and retries) for every batch.

OpenTelemetry's OTLP exporters log each failed batch, and each retry of it, on the logger
named by their module; with ``ttft serve --otlp-endpoint`` pointed at a receiver that is not
up yet that is a line or more per batch. :class:`OneLineFailures` wraps such an exporter: on
the thread that calls it, the exporter's logger is muted, and the outcome of each batch is
reported as a change of state only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["OneLineFailures"]

logger = logging.getLogger("ttft.tracer.export")
_T = TypeVar("_T")


class _OnThreads(logging.Filter):
    """Drops the records logged on the threads currently inside a wrapped call, calling
    ``on_drop`` for each (the exporter's first complaint, before its retries give up)."""

    def __init__(self, on_drop: Callable[[], None]) -> None:
        super().__init__()
        self.threads: set[int] = set()
        self.on_drop = on_drop

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread in self.threads:
            self.on_drop()
            return False
        return True


class OneLineFailures(SpanExporter):
    """Forwards to ``exporter``, muting the logger of its module (``logging.getLogger`` of
    ``type(exporter).__module__``, where OpenTelemetry's exporters log) on the calling thread
    only, and logs on ``ttft.tracer.export``, at WARNING: one line when the exporter first
    complains or a batch fails (naming ``endpoint`` and that spans are dropped until it is
    up), one when a batch goes through again (with the number of batches lost). Other
    threads' use of that logger, and other exporters, are untouched.

    Threading and failure rules are the wrapped exporter's; this adds no thread and never
    raises from ``export`` what the exporter did not.
    """

    def __init__(self, exporter: SpanExporter, endpoint: str) -> None:
        self.exporter = exporter
        self.endpoint = endpoint
        self.failed_batches = 0
        self._down = False
        self._filter = _OnThreads(self._went_down)
        self._logger = logging.getLogger(type(exporter).__module__)
        self._logger.addFilter(self._filter)

    def _muted_call(self, call: Callable[..., _T], *args: object) -> _T:
        me = threading.get_ident()
        self._filter.threads.add(me)
        try:
            return call(*args)
        finally:
            self._filter.threads.discard(me)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export one batch; log a line only when the outcome differs from the last one's."""
        result = self._muted_call(self.exporter.export, spans)
        if result == SpanExportResult.SUCCESS:
            if self._down:
                self._down = False
                logger.warning("span export to %s is up again (%d batches dropped while it "
                               "was down)", self.endpoint, self.failed_batches)
                self.failed_batches = 0
            return result
        self.failed_batches += 1
        self._went_down()
        return result

    def _went_down(self) -> None:
        if not self._down:
            self._down = True
            logger.warning("cannot export spans to %s (nothing listening there yet?): spans "
                           "are dropped until it is up", self.endpoint)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._muted_call(self.exporter.force_flush, timeout_millis))

    def shutdown(self) -> None:
        """Shut the exporter down and stop muting its logger."""
        try:
            self._muted_call(self.exporter.shutdown)
        finally:
            self._logger.removeFilter(self._filter)
