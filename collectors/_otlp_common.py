"""What the OTLP/HTTP and OTLP/gRPC receivers share: the sink, the bearer-token check, storing
an export and its partial-success answer, and the request bookkeeping."""

from __future__ import annotations

import contextlib
import errno
import functools
import hmac
import logging
import threading
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from ttft.collectors._otlp_chunks import Chunk
from ttft.collectors._spans import to_span_table
from ttft.collectors.otlp_rows import request_to_rows
from ttft.collectors.writer import TraceWriter
from ttft.tracer.schema import smallest_examples

Sink = Callable[[pa.Table], None]
"""Takes one table of span rows; called from server threads, so it must be thread-safe."""

MAX_INFLIGHT_BYTES = 256 << 20
"""Default budget on request bytes (after decompression) held by requests in flight."""
RETRY_AFTER_S = 1
"""Seconds an exporter is told to wait when the in-flight budget is spent."""

DISK_FULL = "no space left for the trace; retry later"
"""The message of the retryable answer while the sink's disk is full."""
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
logger = logging.getLogger("ttft.collectors.receiver")

MAX_ERRORS_REPORTED = 10
"""Rejected-span messages joined into a response's ``partial_success.error_message``."""


def as_sink(sink: TraceWriter | Sink) -> Sink:
    """A writer's durable ``append`` (it returns once the rows are on disk, so a receiver
    acknowledges only what a kill cannot take back), or the callable itself."""
    if isinstance(sink, TraceWriter):
        return functools.partial(sink.append, durable=True)
    return sink


def bearer_ok(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` value is ``Bearer <token>`` (scheme case-insensitive).

    The credentials are compared in constant time (``hmac.compare_digest``).
    """
    if authorization is None:
        return False
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.strip().encode(), token.encode())


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk or quota: a condition that passes,
    answered as retryable (HTTP 503 with ``Retry-After``, gRPC ``UNAVAILABLE`` with a
    ``RetryInfo``), since OTLP exporters retry those and drop data on a 500."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def store_export(chunks: Iterable[Chunk], parse_rejected: list[str],
                 sink: Sink) -> tuple[ExportTraceServiceResponse, int, list[str]]:
    """Convert an export's spans to rows chunk by chunk, hand each chunk's rows to ``sink``
    as one table, and answer.

    Args:
        chunks: the export, as requests of a bounded number of spans each
            (:mod:`ttft.collectors._otlp_chunks`), so that only one chunk's rows are held;
            a chunk is a parsed request (converted here by the reference) or a span
            table the compiled path decoded, with its number of spans.
        parse_rejected: one message per span already left out of ``request`` when it was
            parsed (:func:`~ttft.collectors.otlp_rows.parse_json_export`).
        sink: takes the rows; not called for a chunk without a valid span.

    Returns:
        The response (``partial_success`` with ``rejected_spans`` and the first
        ``MAX_ERRORS_REPORTED`` messages joined by ``"; "`` when some spans were rejected),
        the number of spans stored and one message per span rejected.

    Raises:
        Exception: whatever ``sink`` raises. The chunks before it were stored: the sender
            retries the export, so those spans arrive twice (at least once is the rule;
            the analysis keeps one of two spans with the same id).
    """
    rejected = list(parse_rejected)
    stored = 0
    for chunk in chunks:
        if isinstance(chunk, tuple):  # the compiled path: every span valid
            table, spans = chunk
            if table.num_rows:
                sink(table)
            stored += spans
            continue
        rows, errors = request_to_rows(chunk)
        if rows:
            sink(to_span_table(rows))
        rejected += errors
        stored += sum(len(s.spans) for r in chunk.resource_spans for s in r.scope_spans)
        stored -= len(errors)
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = len(rejected)
        response.partial_success.error_message = "; ".join(rejected[:MAX_ERRORS_REPORTED])
    return response, stored, rejected


class ReceiverBookkeeping:
    """The counters, the requests in flight and the stopped flag of a receiver, under one lock.

    A receiver subclasses it, serves each request inside :meth:`_serving` and stops with
    :meth:`_mark_stopped` then :meth:`_wait_idle`. All methods are thread-safe.

    Bytes in flight: a request takes its (decoded) body's size from a budget of
    ``max_inflight_bytes`` (:meth:`_budget`) and gives it back when answered; a request that
    does not fit is refused with a retryable answer, unless no other request holds any (so
    one request larger than the budget still goes through alone).

    Attributes:
        requests: requests answered, whatever the status.
        spans_received: spans accepted and handed to the sink.
        spans_rejected: invalid spans dropped from otherwise good requests.
        rejected_examples: the smallest distinct messages of those (at most
            `tracer.schema.EXAMPLES`), for the run metadata's ``rejected``.
        rejected: requests answered with an error status.
        max_inflight_bytes: the budget on bytes in flight.
    """

    def __init__(self, max_inflight_bytes: int = MAX_INFLIGHT_BYTES) -> None:
        self._lock = threading.Condition()  # guards the counters, _inflight* and _stopped
        self._inflight = 0
        self._inflight_bytes = 0
        self.max_inflight_bytes = max_inflight_bytes
        self._stopped = False
        self.requests = 0
        self.spans_received = 0
        self.spans_rejected = 0
        self.rejected_examples: list[str] = []
        self.rejected = 0
        self.disk_was_full = False

    @contextlib.contextmanager
    def _serving(self) -> Iterator[bool]:
        """Counts one request; yields whether it is admitted (False once stopped).

        An admitted request is in flight until the block exits, however it exits.
        """
        with self._lock:
            admitted = not self._stopped
            self._inflight += admitted
            self.requests += 1
        try:
            yield admitted
        finally:
            if admitted:
                with self._lock:
                    self._inflight -= 1
                    self._lock.notify_all()

    @contextlib.contextmanager
    def _budget(self) -> Iterator[Callable[[int], bool]]:
        """Yields ``take(n_bytes) -> bool``: whether ``n_bytes`` more fit the in-flight budget
        (they are then held); all that was taken is given back when the block exits."""
        held = 0

        def take(n_bytes: int) -> bool:
            nonlocal held
            with self._lock:
                if (self._inflight_bytes > held
                        and self._inflight_bytes + n_bytes > self.max_inflight_bytes):
                    return False
                self._inflight_bytes += n_bytes
                held += n_bytes
                return True

        try:
            yield take
        finally:
            with self._lock:
                self._inflight_bytes -= held

    def _disk(self, full: bool, where: object) -> None:
        """Note whether the last store found the disk full: logged once when it fills and
        once when it has space again, never once per request."""
        with self._lock:
            changed, self.disk_was_full = self.disk_was_full != full, full
        if changed and full:
            logger.warning("%s: the disk is full; exports are answered as retryable until "
                           "it has space", where)
        elif changed:
            logger.warning("%s: the disk has space again; exports are stored", where)

    def _count_rejected(self) -> None:
        with self._lock:
            self.rejected += 1

    def _count_spans(self, received: int, rejected: list[str]) -> None:
        with self._lock:
            self.spans_received += received
            self.spans_rejected += len(rejected)
            if rejected:
                self.rejected_examples = smallest_examples([self.rejected_examples, rejected])

    def _mark_stopped(self) -> bool:
        """Admit no more requests. Returns whether it was already stopped."""
        with self._lock:
            already, self._stopped = self._stopped, True
        return already

    def _wait_idle(self, timeout_s: float) -> bool:
        """Whether no admitted request was in flight within ``timeout_s``."""
        with self._lock:
            return self._lock.wait_for(lambda: self._inflight == 0, max(0.0, timeout_s))
