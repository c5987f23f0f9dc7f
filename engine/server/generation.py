"""One generation as the server answers it: the engine's token events turned into text
pieces (stop strings cut the text; text that may begin a stop string is held back until
later tokens tell), the usage body, the request's metrics, and the answer itself, whole
(``complete``) or as server-sent events (``stream``).

A generation left early (the client went away, the server shuts down, an error) cancels
its engine request, so its K/V blocks are freed at the engine's next iteration.

Tracing, after the first token's ``detokenize`` (its event's ``text_ns``) up to the send of
the first text: ``holdback`` while that text waits for later tokens (a split UTF-8
character, a possible stop-string prefix, or, not streamed, the rest of the answer), with
the reason and how many tokens it waited for; then ``deliver`` (``leg="to_send"``) from
the moment the text was ready to the start of the send of the body chunk that carries it.

With ``report_timings`` the answer also says what the generation's times were (the final
chunk's or the body's ``timings``, a whole answer's ``Server-Timing``; ``timings``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from ttft.engine.engine import EngineStopped
from ttft.engine.server.errors import APIError
from ttft.engine.server.metrics import Metrics
from ttft.engine.server.models import Response
from ttft.engine.server.timings import Timings
from ttft.engine.stream import RequestStream, TokenEvent
from ttft.tracer import clock_ns, record

__all__ = ["Generation", "complete", "held_back", "sse", "stream"]

log = logging.getLogger(__name__)
_DONE = b"data: [DONE]\n\n"


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` may begin a stop string."""
    held = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:k]):
                held = k
                break
    return held


def _first_stop(text: str, stops: Sequence[str], searched: int) -> int:
    """Where the first stop string in ``text`` begins (-1 for none), knowing that none
    ends within ``text[:searched]``: only the new tail is searched, so a long output costs
    each token ``O(new text + longest stop)``, not ``O(output)``."""
    found = (text.find(s, max(0, searched - len(s) + 1)) for s in stops)
    return min((i for i in found if i >= 0), default=-1)


def _usage(event: TokenEvent) -> dict[str, Any]:
    """OpenAI's usage body from a request's last token event."""
    u = event.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


@dataclass
class Outcome:
    """How a generation ended: its ``finish_reason`` and usage body, once it ended."""

    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


class Generation:
    """Runs one submitted request: yields text pieces, applies stop strings, records
    metrics, and cancels the engine request when it is left early.

    Args:
        stream: the engine request's token stream.
        stops: the stop strings (empty ones ignored).
        metrics: the application's metrics.
        received_ns: when the endpoint received the request (``clock_ns()``).
        report_timings: say the generation's times in the answer (`timings`).
    """

    def __init__(
        self, stream: RequestStream, stops: Sequence[str], metrics: Metrics, received_ns: int,
        report_timings: bool = False,
    ) -> None:
        self.stream = stream
        self.report_timings = report_timings
        self.stops = [s for s in stops if s]
        self.metrics = metrics
        self.received_ns = received_ns
        self.outcome = Outcome()
        self._accounted = False
        self._seen = 0  # token events read
        self._first_ns = self._last_ns = 0  # text_ns of the first and of the latest
        self._first_held = ""  # why the first token's text did not go out with it
        self._ready_ns = 0  # when the first text that goes out was ready; 0 before
        self._delivered = False

    async def pieces(self) -> AsyncIterator[str]:
        """The text as it becomes safe to send; ``outcome`` is set once it ends."""
        full, emitted, last = "", 0, None
        try:
            async for ev in self.stream:
                self._seen += 1
                if self._seen > 1:
                    self.metrics.itl.observe(max(0, ev.text_ns - self._last_ns) / 1e9)
                self._last_ns = ev.text_ns
                if last is None:
                    self._first_token(ev)
                last, searched = ev, len(full)
                full += ev.text
                cut = _first_stop(full, self.stops, searched)
                if cut >= 0:
                    if cut > emitted:
                        yield full[emitted:cut]
                    emitted = cut
                    self.outcome.finish_reason = "stop"
                    self.stream.cancel()
                    break
                if ev.finished:
                    if len(full) > emitted:
                        yield full[emitted:]
                    emitted = len(full)
                    self.outcome.finish_reason = ev.finish_reason or "stop"
                    break
                safe = len(full) - held_back(full, self.stops)
                if safe > emitted:
                    yield full[emitted:safe]
                    emitted = safe
            if last is not None:
                self.outcome.usage = _usage(last)
            self._account("ok", last)
        except BaseException as e:  # an engine error, or the reader left (cancelled)
            self.stream.cancel()
            self._account("error" if isinstance(e, Exception) else "cancelled", last)
            raise

    def timings(self) -> Timings | None:
        """The ended generation's times, when ``report_timings`` asked for them and it was
        admitted and made a token; else None."""
        admitted, queue_s = self.stream.admitted_ns, self.stream.queue_seconds
        usage = self.outcome.usage
        if not (self.report_timings and admitted and self._first_ns and usage):
            return None
        return Timings(self.received_ns, round(queue_s * 1e9) if queue_s else 0, admitted,
                       self._first_ns, self._last_ns, clock_ns(), usage["prompt_tokens"],
                       usage["prompt_tokens_details"]["cached_tokens"],
                       usage["completion_tokens"])

    def close(self) -> None:
        """Cancel the engine request unless it finished (idempotent)."""
        self.stream.cancel()
        self._account("cancelled", None)

    def text_ready(self, whole: bool = False) -> None:
        """The first text to be sent is ready: the latest token event completed it. Records
        ``holdback`` (first token's text → now, ``reason`` and ``waited_tokens``) when it
        waited for later tokens; ``whole`` says the answer is sent in one piece (reason
        ``not_streamed``). Only the first call counts."""
        if self._ready_ns or not self._seen:
            return
        self._ready_ns = self._last_ns
        if self._seen > 1 and self._first_ns:
            record(
                "holdback",
                self._first_ns,
                self._ready_ns,
                request_id=self.stream.request_id,
                parent=self.stream.parent,
                reason="not_streamed" if whole else self._first_held,
                waited_tokens=self._seen - 1,
            )

    def sending(self) -> None:
        """A body chunk is being handed to the server now: the first after `text_ready`
        carries the first text, and its ``deliver`` (ready → now) is recorded."""
        if self._ready_ns and not self._delivered:
            self._delivered = True
            record(
                "deliver",
                self._ready_ns,
                clock_ns(),
                request_id=self.stream.request_id,
                parent=self.stream.parent,
                leg="to_send",
            )

    def _first_token(self, ev: TokenEvent) -> None:
        now_ns = clock_ns()
        self._first_ns = ev.text_ns
        self._first_held = "stop_string" if ev.text or ev.finished else "utf8"
        m = self.metrics
        m.ttft.observe((now_ns - self.received_ns) / 1e9)
        queue_s, admitted_ns = self.stream.queue_seconds, self.stream.admitted_ns
        if queue_s is not None and admitted_ns is not None:
            m.queue.observe(queue_s)
            m.prefill.observe(max(0, now_ns - admitted_ns) / 1e9)

    def _account(self, status: str, last: TokenEvent | None) -> None:
        if self._accounted:
            return
        self._accounted = True
        m = self.metrics
        m.requests(status).inc()
        m.e2e.observe((clock_ns() - self.received_ns) / 1e9)
        if last is not None:
            m.prompt_tokens.inc(last.usage.prompt_tokens)
            m.generation_tokens.inc(last.usage.completion_tokens)
            m.prefix_hits.inc(last.usage.cached_tokens)
            tokens = max(last.usage.completion_tokens, self._seen)
            if status == "ok" and tokens >= 2 and self._first_ns:
                m.tpot.observe(max(0, self._last_ns - self._first_ns) / 1e9 / (tokens - 1))


def _engine_stopped(e: EngineStopped) -> APIError:
    return APIError(503, str(e), type="server_error", code="engine_stopped")


def _traced_send(gen: Generation, send: Any) -> Any:
    """``send`` telling ``gen`` when each body chunk is handed over (`Generation.sending`)."""

    async def traced(message: Any) -> None:
        if message.get("type") == "http.response.body":
            gen.sending()
        await send(message)

    return traced


class _EngineJSONResponse(JSONResponse):
    """The whole answer of a generation, its ``deliver`` recorded as its body is sent."""

    def __init__(self, content: Any, generation: Generation,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(content, headers=headers)
        self._generation = generation

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await super().__call__(scope, receive, _traced_send(self._generation, send))


async def complete(gen: Generation, response: Response) -> JSONResponse:
    """The whole (non-streamed) answer of ``gen``, as a JSON response.

    Raises:
        APIError: 503 when the engine stopped, 500 when the generation failed.
    """
    try:
        text = "".join([p async for p in gen.pieces()])
        gen.text_ready(whole=True)
    except EngineStopped as e:
        raise _engine_stopped(e) from None
    except Exception as e:
        log.exception("ttft server: request %s failed", response.id)
        raise APIError(500, f"generation failed: {e}", type="server_error") from None
    finally:
        gen.close()
    body = response.whole(text, gen.outcome.finish_reason, gen.outcome.usage)
    timings = gen.timings()
    if timings is None:
        return _EngineJSONResponse(body, gen)
    body["timings"] = timings.llama()
    return _EngineJSONResponse(body, gen, {"Server-Timing": timings.server_timing()})


def sse(payload: Any) -> bytes:
    """One server-sent event carrying ``payload`` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def _events(gen: Generation, response: Response, include_usage: bool) -> AsyncIterator[bytes]:
    if response.chat:
        yield sse(response.chunk([response.choice(None, None, role=True)], include_usage))
    try:
        async for piece in gen.pieces():
            if piece:
                gen.text_ready()
                yield sse(response.chunk([response.choice(piece, None)], include_usage))
    except EngineStopped as e:
        yield sse(APIError(503, str(e), type="server_error").body())
        yield _DONE
        return
    except Exception as e:  # this request failed in the engine (its sampling, its prefill)
        log.exception("ttft server: request %s failed", response.id)
        yield sse(APIError(500, f"generation failed: {e}", type="server_error").body())
        yield _DONE
        return
    timings = gen.timings()
    extra = {} if timings is None else {"timings": timings.llama()}
    yield sse(response.chunk([response.choice(None, gen.outcome.finish_reason)], include_usage,
                             **extra))
    if include_usage:
        yield sse(response.chunk([], include_usage, usage=gen.outcome.usage))
    yield _DONE


class _EngineStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that cancels its engine request however the response
    ends (client disconnect, server shutdown, an error)."""

    def __init__(self, content: AsyncIterator[bytes], generation: Generation) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._generation = generation

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, _traced_send(self._generation, send))
        finally:
            self._generation.close()


def stream(gen: Generation, response: Response, include_usage: bool) -> StreamingResponse:
    """``gen`` as server-sent events: for chat a role chunk first, a chunk per text piece,
    a final chunk with the finish reason, the usage chunk when ``include_usage``, then
    ``[DONE]``; an engine that stops mid-stream, or a generation that fails, ends it with an
    error event then ``[DONE]``."""
    return _EngineStreamingResponse(_events(gen, response, include_usage), gen)
