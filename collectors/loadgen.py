"""The load generator: sends a workload to any OpenAI-compatible streaming server and records
the client's view of every request as span rows (docs/design.md, stages ``client`` and
``connect``, the client events, the ``client`` TTFT window).

It speaks plain HTTP/1.1 through its own small keep-alive client (``_sender``: each request
is one write of bytes encoded before it is due, and response bytes are timestamped as the
event loop delivers them) and never imports the reference engine, so it traces any server.
One sender sends the requests in arrival order, each at one start time + its arrival
offset, so a slow request never delays the schedule of the next;
benchmarks/client_accuracy.py measures how closely. A request's rows (``_client_request``)
go to the trace writer as the request ends, so a run cut short keeps every finished one;
the requests in flight when it stops end ``cancelled`` and keep their rows too.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ttft.collectors._client_request import SERVICE, Request, RequestResult, send
from ttft.collectors._pool import Pool
from ttft.collectors._sender import Origin, wait_until
from ttft.collectors._spans import to_span_table
from ttft.collectors._trace_process import RowPipe
from ttft.collectors.workloads import WorkItem, Workload
from ttft.tracer.api import clock_ns
from ttft.tracer.context import format_traceparent
from ttft.tracer.schema import ATTR_ESTIMATED, OUTCOME_CANCELLED, smallest_examples

if TYPE_CHECKING:
    from ttft.collectors.writer import TraceWriter

__all__ = ["SERVICE", "RequestResult", "results_table", "run"]

logger = logging.getLogger(__name__)

_ESTIMATED = f'"{ATTR_ESTIMATED}"'
"""How an estimated span's attributes text names the key (``rows.attributes_json``)."""
START_DELAY_NS = 2_000_000
"""The schedule starts this long after the warm-up, so the first request is not late."""
SPARE = 4
"""Connections an open loop keeps opened ahead of its arrivals."""
MAX_SPARE = 64
"""The most connections a closed loop opens before its first wave (its concurrency, up to
this many)."""
CANCELLED_ERROR = "the run stopped before the response ended"
"""The ``error`` of a request that ended ``cancelled``."""


class _Encoder:
    """Encodes a work item as the request bytes of its ``_client_request.Request``."""

    def __init__(self, origin: Origin, *, chat: bool, model: str | None,
                 api_key: str | None, sample: float = 1.0) -> None:
        self.origin, self.chat, self.model, self.sample = origin, chat, model, sample
        self.path = "/v1/chat/completions" if chat else "/v1/completions"
        self.headers = [("content-type", "application/json"), ("accept", "text/event-stream")]
        if api_key:
            self.headers.append(("authorization", f"Bearer {api_key}"))

    def __call__(self, item: WorkItem, req: Request) -> bytes:
        body: dict[str, Any] = {"max_tokens": item.max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.model is not None:
            body["model"] = self.model
        if self.chat:
            content = item.prompt if isinstance(item.prompt, str) else " ".join(
                map(str, item.prompt))
            body["messages"] = [{"role": "user", "content": content}]
        else:
            body["prompt"] = item.prompt
        # warm-up requests (index -1) say "not sampled": servers record nothing of them;
        # others are sampled by their trace id's low 64 bits (W3C/OTel ratio sampling)
        sampled = req.result.index >= 0 and (
            self.sample >= 1.0 or int(req.trace_id[16:], 16) < self.sample * 2.0**64)
        traceparent = format_traceparent(int(req.trace_id, 16), req.span_id, sampled)
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        return self.origin.request("POST", self.path, [*self.headers,
                                                       ("traceparent", traceparent)], data)


class _RowSink:
    """Appends each finished request's rows to a trace writer, one request per append, on a
    thread of its own: converting rows (about 0.25 ms a request) and writing the part files
    the writer flushes must not hold up the event loop that keeps the schedule. The thread
    mostly runs while the loop waits for bytes.

    Failure: a failed append is logged and remembered (the first one); :meth:`close` returns
    it after the rows queued before it were appended.

    The spans placed from timings a server reported (``ATTR_ESTIMATED``) are counted, and
    :meth:`close` adds them to the writer's run metadata as ``estimated`` (the
    ``estimated_span`` defect, as an importer counts Dynamo's estimates).
    """

    def __init__(self, writer: TraceWriter) -> None:
        self._writer = writer
        self._estimated: list[str] = []  # trace id of each estimated span
        self._queue: queue.SimpleQueue[list[dict[str, Any]] | None] = queue.SimpleQueue()
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._drain, name="ttft-loadgen-rows",
                                        daemon=True)
        self._thread.start()

    def put(self, rows: list[dict[str, Any]]) -> None:
        """Queue one request's rows; called on the event loop, never blocks."""
        self._queue.put(rows)

    def _drain(self) -> None:
        while (rows := self._queue.get()) is not None:
            self._estimated += [r["trace_id"] for r in rows if _ESTIMATED in r["attributes"]]
            try:
                self._writer.append(rows)
            except Exception as exc:
                logger.exception("%s: cannot append a request's rows", self._writer.path)
                self._error = self._error or exc

    async def finish(self) -> Exception | None:
        """Append every queued request's rows, stop the thread; the first failure or None."""
        self._queue.put(None)
        self._thread.join()
        if self._estimated:  # one run per writer: its count is the run's
            try:
                self._writer.set_metadata(estimated={
                    "count": len(self._estimated),
                    "examples": smallest_examples([self._estimated])})
            except Exception as exc:
                logger.exception("%s: cannot record the estimated spans", self._writer.path)
                self._error = self._error or exc
        return self._error


class _Schedule:
    """Requests handed to the client: those in flight (at most ``limit``), those waiting for
    a slot, and the results of those that ended (or were cancelled when the run stopped)."""

    def __init__(self, pool: Pool, size: int, limit: int, timeout_s: float,
                 rows: _RowSink | RowPipe | None, on_sent: Callable[[int], None] | None,
                 on_result: Callable[[RequestResult], None] | None) -> None:
        self.pool, self.limit, self.timeout_s, self.rows = pool, limit, timeout_s, rows
        self.on_sent, self.on_result = on_sent, on_result
        self.results: list[RequestResult | None] = [None] * size
        self.tasks: list[asyncio.Task[None]] = []
        self.waiting: deque[tuple[Request, bytes]] = deque()
        self.running: dict[int, Request] = {}  # in flight, by workload index
        self.in_flight = 0
        self.stopping = False

    def due(self, req: Request, wire: bytes) -> None:
        """A request is due: hand it to the client, or queue it until a slot is free."""
        if self.in_flight < self.limit:
            self._launch(req, wire)
        else:
            self.waiting.append((req, wire))

    def _launch(self, req: Request, wire: bytes) -> None:
        """Hand a due request to the client: write it now if a connection is idle."""
        self.in_flight += 1
        self.running[req.result.index] = req
        req.start_ns = clock_ns()
        conn = self.pool.take()
        if conn is not None:
            req.send_on(conn, wire)
        if self.on_sent is not None:
            self.on_sent(req.result.index)
        self.tasks.append(asyncio.get_running_loop().create_task(self._complete(req, wire)))
        self.pool.prepare()  # the next request should find a connection ready

    async def _complete(self, req: Request, wire: bytes) -> None:
        result = await send(self.pool, req, wire, self.timeout_s)
        del self.running[result.index]
        self._keep(result)
        self.in_flight -= 1
        while self.waiting and self.in_flight < self.limit and not self.stopping:
            self._launch(*self.waiting.popleft())
        if self.on_result is not None:
            self.on_result(result)

    async def wait(self) -> None:
        """Until every request ended, those that waited for a slot included."""
        launched = 0
        while launched < len(self.tasks):  # requests that waited for a slot launch meanwhile
            launched = len(self.tasks)
            await asyncio.gather(*self.tasks)

    def _keep(self, result: RequestResult) -> None:
        if self.rows is not None:
            self.rows.put(result.rows)
        self.results[result.index] = result

    async def cancel(self) -> None:
        """Stop: the requests waiting for a slot are never sent; those still running are
        cancelled and waited for (each closes its connection, whose response it will never
        read), then end ``cancelled`` at this moment, their rows kept like any other's
        (the client span, so the server's spans of the request keep their parent). They
        are not passed to ``on_result``: they did not end by themselves."""
        self.stopping = True
        self.waiting.clear()
        stopped_ns = clock_ns()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        tls = self.pool.origin.ssl is not None
        for index in sorted(self.running):
            req = self.running.pop(index)
            req.fail(OUTCOME_CANCELLED, CANCELLED_ERROR)  # a failure seen before stays
            req.tls = tls
            self._keep(req.finish(max(stopped_ns, req.start_ns)))

    def ended(self) -> list[RequestResult]:
        return [r for r in self.results if r is not None]


@contextlib.contextmanager
def _gc_frozen() -> Iterator[None]:
    """Collect now, not mid-run: objects that exist now are left out of later full
    collections (unless the caller froze some already)."""
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.collect()
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


async def _warm_up(pool: Pool, encode: _Encoder, count: int, timeout_s: float) -> None:
    """Send ``count`` short untraced requests one at a time, then open the spare connections
    the first requests will use."""
    for i in range(count):
        item = WorkItem(0.0, f"Warm-up request {i}.", 1)
        req = Request(-1, clock_ns(), item)
        wire = encode(item, req)
        req.start_ns = clock_ns()
        await send(pool, req, wire, timeout_s)
    if count:
        pool.prepare()
        await pool.ready(timeout_s)


async def run(base_url: str, workload: Workload, *, chat: bool = False, model: str | None = None,
              concurrency: int | None = None, warmup: int = 0, api_key: str | None = None,
              timeout_s: float = 60.0, writer: TraceWriter | RowPipe | None = None,
              on_sent: Callable[[int], None] | None = None,
              on_result: Callable[[RequestResult], None] | None = None,
              sample: float = 1.0) -> list[RequestResult]:
    """Send ``workload`` to an OpenAI-compatible server, streaming, and trace each request.

    Each request is due at run start (2 ms after the warm-up) + its ``arrival_s``: the
    ``scheduled`` event is that due time. One sender sends them in arrival order, each from
    bytes encoded before it is due, on a keep-alive connection opened ahead of time when one
    is free (a ``connect`` span marks a wait for a new one). With ``concurrency`` a due
    request then waits for a slot, and the ``client`` span starts only when it is handed to
    the HTTP client. Every request gets a fresh trace (``traceparent`` carries the client
    span's id) and a total ``timeout_s``. Failures (HTTP errors, disconnects, timeouts) are
    recorded in ``error``, never raised. Plain HTTP/1.1 (``_sender``): no proxies.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` (``/v1/...`` is appended).
        workload: the requests.
        chat: use ``/v1/chat/completions`` (one user message) instead of ``/v1/completions``.
        model: the ``model`` field; omitted when None.
        concurrency: the most requests in flight; None for no limit.
        warmup: this many short untraced requests are sent first, one at a time; then
            spare connections are opened before the schedule starts (with ``concurrency``
            as many as it allows, up to 64, so its first wave waits for no handshake).
        api_key: sent as ``Authorization: Bearer``.
        timeout_s: the longest one request may take, end to end.
        writer: where each request's rows go as the request ends: a ``TraceWriter`` in
            this process (appended on a thread of its own, which competes with the event
            loop for the interpreter: benchmarks/client_accuracy.py), or the rows pipe of a
            writer in a process of its own (``TraceProcess.rows``, what ``ttft trace``
            uses: one JSON encoding and a non-blocking write per request on the loop). When the
            run stops early (cancelled, Ctrl-C), each request still in flight ends with
            outcome ``cancelled`` (its client span cut at the stop), and the rows of every
            request sent are appended before the exception goes on; requests not yet sent
            leave none.
        on_sent: called with a request's index when it is handed to the HTTP client.
        on_result: called with each result as its request ends (for progress displays);
            never for a request cancelled by the stop, so the requests sent but not
            passed here are those the stop cancelled.
        sample: the share of requests whose ``traceparent`` says "sampled" (by trace id),
            so a traced server records that share of them (what tracing costs at a
            sampling rate, benchmarks/sampling_cost.py); below 1 only without a writer,
            whose trace would then hold client spans of requests no server recorded.

    Returns:
        One result per workload item, in workload order.

    Raises:
        ValueError: ``concurrency`` below 1, or ``base_url`` not an http(s) URL; or the
            writer refused rows (closed, or rows that do not fit the schema).
        OSError: the writer failed to write a part file.
    """
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if not 0.0 <= sample <= 1.0 or (sample < 1.0 and writer is not None):
        raise ValueError(f"sample must be within 0..1, and 1 with a writer, not {sample}")
    origin = Origin(base_url)
    encode = _Encoder(origin, chat=chat, model=model, api_key=api_key, sample=sample)
    limit = concurrency or max(1, len(workload))
    # a closed loop's first wave is due at once: each of its requests finds a connection
    # opened during the warm-up, not a handshake (and the client's work to start it) in its
    # TTFT; an open loop keeps a few spare ahead of its arrivals
    pool = Pool(origin, limit, spare=min(concurrency, MAX_SPARE) if concurrency else SPARE)
    rows = writer if writer is None or isinstance(writer, RowPipe) else _RowSink(writer)
    schedule = _Schedule(pool, len(workload), limit, timeout_s, rows, on_sent, on_result)
    with _gc_frozen():
        try:
            if isinstance(rows, RowPipe):
                await rows.open()
            await _warm_up(pool, encode, warmup, timeout_s)
            start_ns = clock_ns() + START_DELAY_NS
            for index in sorted(range(len(workload)), key=lambda i: workload[i].arrival_s):
                item = workload[index]
                req = Request(index, start_ns + round(item.arrival_s * 1e9), item)
                wire = encode(item, req)
                await wait_until(req.events[0][1])
                schedule.due(req, wire)
            await schedule.wait()
        finally:
            await schedule.cancel()  # a request still running ends cancelled, with rows
            failed = await rows.finish() if rows is not None else None
            await pool.close()
    if failed is not None:
        raise failed
    return schedule.ended()


def results_table(results: Sequence[RequestResult]) -> pa.Table:
    """All rows of ``results`` as one table with exactly SPAN_SCHEMA."""
    return to_span_table([row for r in results for row in r.rows])
