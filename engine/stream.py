"""One request as the engine holds it (``RequestState``) and as its caller reads it
(``RequestStream``, an async iterator of ``TokenEvent``).

Threading: the engine's worker thread writes a request's state and hands each sampled
token to the request's ``asyncio.Queue`` with ``loop.call_soon_threadsafe``; the stream
reads that queue on the request's event loop and detokenizes there. Cancelling only sets
a flag and wakes the worker, which frees the request's K/V at its next iteration.

Tracing (the first token only): ``deliver`` from the ``first_sampled`` time to the moment
the stream took the token off its queue (the token id waiting for the event loop), then
``detokenize`` from there until its text exists; the event's ``text_ns`` is that end, where
the server's ``holdback`` or ``deliver`` of the text begins.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ttft.engine.faults import async_sleep_for
from ttft.engine.kv_cache import Seq
from ttft.engine.sampler import SamplingParams
from ttft.engine.tokenizer import Tokenizer
from ttft.tracer import SpanRef, clock_ns, record

__all__ = ["RequestState", "RequestStream", "TokenEvent", "Usage"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token as the request sees it.

    Attributes:
        text: the new text; empty while a multi-byte character is still incomplete.
        finish_reason: ``"stop"`` (EOS), ``"length"`` (``max_tokens``) or None.
        text_ns: ``clock_ns()`` when ``text`` was decoded (for the first token: the end of
            its ``detokenize`` span); 0 when not known.
    """

    token_id: int
    text: str
    finished: bool
    finish_reason: str | None
    usage: Usage
    text_ns: int = 0


@dataclass(eq=False)
class RequestState:
    """One submitted request: set up by ``Engine.submit``, then owned by the worker thread
    (only ``cancelled`` is written from the request's side).

    Attributes:
        parent: the span its request-level spans nest under.
        arrival_ns, eligible_ns, admitted_ns: ``clock_ns()`` times it entered the waiting
            queue, may be admitted (after an injected queue delay), was admitted (0 before).
        scheduled_ns: when its admission work ended (its ``batch_wait`` begins); 0 before
            admission and once its ``batch_wait`` is recorded.
        sampled_ns: when its first token id was sampled (``first_sampled``); 0 before.
        queue_ref: its ``queue`` span, once admitted (an engine step links to it when the
            request has no open span).
        computed: prompt positions whose K/V is in ``seq``.
        chunks: the prefill chunks run so far, ``(start_ns, end_ns, attributes)``, recorded
            as spans when the prefill ends or is cut.
        recompute_ids: None until it is preempted; then what it prefills when admitted
            again: its prompt and the tokens it had generated (``context_ids``).
        preempted_ns: when it was last preempted, while it waits to be admitted again
            (its ``preempted`` span begins); 0 otherwise.
        preempted_attrs: that span's attributes (who needed its blocks, blocks freed).
    """

    rid: str
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    delays_ms: dict[str, float]
    parent: SpanRef
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrival_ns: int = 0
    eligible_ns: int = 0
    admitted_ns: int = 0
    scheduled_ns: int = 0
    sampled_ns: int = 0
    generator: torch.Generator | None = None
    seq: Seq | None = None
    queue_ref: SpanRef | None = None
    cached_tokens: int = 0
    computed: int = 0
    out_ids: list[int] = field(default_factory=list)
    chunks: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)
    cancelled: bool = False
    recompute_ids: list[int] | None = None
    preempted_ns: int = 0
    preempted_attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def context_ids(self) -> list[int]:
        """The tokens its prefill computes: the prompt, or after a preemption the prompt
        and the tokens it generated before it (recompute)."""
        return self.prompt_ids if self.recompute_ids is None else self.recompute_ids


class RequestStream:
    """The tokens of one request as an async iterator of ``TokenEvent``.

    Closing it (``aclose``/``cancel``) or cancelling the task awaiting it cancels the
    request: the worker drops its K/V references at its next iteration. A request that
    fails or whose engine stops raises the error from ``__anext__``.

    Args:
        req: the request's state, shared with the engine's worker.
        tokenizer: decodes the sampled ids.
        wake: wakes the worker (called on cancel, from the request's side).
    """

    def __init__(self, req: RequestState, tokenizer: Tokenizer, wake: Callable[[], None]) -> None:
        self._req = req
        self._tokenizer = tokenizer
        self._wake = wake
        self._done = False
        self._ids: list[int] = []
        self._text = ""

    @property
    def request_id(self) -> str:
        return self._req.rid

    @property
    def parent(self) -> SpanRef:
        """The span the request's spans nest under (``RequestState.parent``)."""
        return self._req.parent

    @property
    def queue_seconds(self) -> float | None:
        """How long the request waited for admission (its ``queue`` span), once admitted;
        None before that."""
        req = self._req
        return (req.admitted_ns - req.arrival_ns) / 1e9 if req.admitted_ns else None

    @property
    def admitted_ns(self) -> int | None:
        """When the request was admitted, in ``clock_ns()`` time; None before."""
        return self._req.admitted_ns or None

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._done:
            raise StopAsyncIteration
        req = self._req
        try:
            item = await req.queue.get()
        except BaseException:
            self.cancel()
            raise
        if isinstance(item, BaseException):
            self._done = True
            raise item
        token_id, finished, reason, cached = item
        ids = self._ids
        ids.append(token_id)
        t0_ns = clock_ns()
        full = self._tokenizer.decode(ids)
        text = ""
        if finished or not full.endswith("\ufffd"):  # hold a split multi-byte character
            text, self._text = full[len(self._text) :], full
        if len(ids) == 1:
            await async_sleep_for(req.delays_ms, "detokenize")
        text_ns = clock_ns()
        if len(ids) == 1:
            self._trace_first(t0_ns, text_ns)
        if finished:
            self._done = True
        usage = Usage(len(req.prompt_ids), len(ids), cached)
        return TokenEvent(token_id, text, finished, reason, usage, text_ns)

    def _trace_first(self, t0_ns: int, text_ns: int) -> None:
        """``deliver`` (the first token id waiting for this event loop, from
        ``first_sampled`` to ``t0_ns``) and ``detokenize`` (``t0_ns`` to ``text_ns``)."""
        req = self._req
        if req.sampled_ns:
            record(
                "deliver", req.sampled_ns, t0_ns, request_id=req.rid, parent=req.parent,
                leg="to_loop",
            )
        record("detokenize", t0_ns, text_ns, request_id=req.rid, parent=req.parent)

    def cancel(self) -> None:
        """Cancel the request (idempotent; nothing happens once it finished)."""
        if not self._done:
            self._done = True
            self._req.cancelled = True
            self._wake()

    async def aclose(self) -> None:
        self.cancel()
