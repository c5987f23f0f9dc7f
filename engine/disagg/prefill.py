"""``PrefillEngine``: the prefill worker's engine. It runs each request's prompt in chunks
(prefix cache, continuous batching and spans as ``Engine`` has them), sends the K/V blocks
each chunk finished as soon as the chunk ends, samples the first token, sends it, and lets
the request go: the decode side continues it.

Messages it puts on the channel (``ttft.engine.disagg.channel``), per request in this
order: ``blocks`` (``first``, ``count``: block indices of the prompt, ``begin_ns``: when the
request's first block was handed to the channel, on this process's clock), and ``token``
(the first token, ``sampled_ns``, ``cached_tokens``; payload: the request's generator state,
so seeded sampling continues where it left off), or ``error``. The token follows every
block when the decode side delivers it, and precedes the last chunk's blocks when the
prefill side does (``PrefillEngine.first_token``). With a shared-memory ring
(``PrefillEngine.ring``) a ``blocks`` message carries no payload but names the ring's
slot its blocks were packed into (``RingWriter.send_blocks``).

An injected ``kv_transfer`` delay sleeps after the request's first blocks went out and
before its last block goes: inside the transfer, and before ``sample`` when the first
token is delivered from the decode side, after the token otherwise.

It changes ``Engine`` only through its hooks (``ttft.engine.hooks``): ``on_chunk_done``
sends blocks, ``deliver`` sends the token, ``on_drop`` sends an error and forgets the
request.

Threading: as ``Engine``; ``enqueue`` and ``cancel`` are called from the control thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ttft.engine.disagg.channel import Outbox, pack_blocks
from ttft.engine.disagg.shm import RingWriter
from ttft.engine.engine import Engine, QueueFull
from ttft.engine.faults import sleep_for
from ttft.engine.hooks import TokenItem
from ttft.engine.sampler import SamplingParams, make_generator
from ttft.engine.stream import RequestState
from ttft.tracer import SpanRef, clock_ns, parse_traceparent, record

__all__ = ["PrefillEngine", "remote_parent", "trace_fields"]


def trace_fields(parent: SpanRef) -> dict[str, Any]:
    """How a request's parent span travels in a ``prefill`` message: its W3C
    ``traceparent``, or (a request whose spans are the top of their trace) its trace id."""
    if parent.span_id:
        return {"traceparent": parent.traceparent}
    return {"trace_id": f"{parent.trace_id:032x}", "sampled": parent.sampled}


def remote_parent(fields: dict[str, Any], request_id: str) -> SpanRef:
    """The parent ``trace_fields`` describes, for the worker's spans of ``request_id``.

    Raises:
        ValueError: neither a valid ``traceparent`` nor a trace id.
    """
    parsed = parse_traceparent(fields.get("traceparent"))
    if parsed is not None:
        trace_id, span_id, sampled = parsed
        return SpanRef(trace_id, span_id, request_id, None, True, sampled)
    trace_id = int(fields["trace_id"], 16)
    if not trace_id:
        raise ValueError("a prefill message needs a traceparent or a non-zero trace id")
    return SpanRef(trace_id, 0, request_id, None, False, bool(fields.get("sampled", True)))


@dataclass
class _Sent:
    blocks: int = 0  # prompt blocks handed to the channel
    begin_ns: int = 0  # when the first of them was


class PrefillEngine(Engine):
    """An ``Engine`` that prefills and samples the first token only, sending K/V blocks
    and the token on ``outbox``. Requests come in by ``enqueue`` (ids already checked by
    the decode side), not ``submit``.

    ``first_token``: ``decode`` sends every block before sampling (the decode side
    delivers the token after the transfer); ``prefill`` sends the token right after
    sampling and the blocks of the last chunk after it (the token goes out first).
    ``ring_spec``: the decode side's shared-memory ring (``ShmRing.spec``) to send the
    blocks through (``ring``; waits there while the ring is full), or None: the socket."""

    def __init__(
        self, *args: Any, outbox: Outbox, first_token: str = "decode",
        ring_spec: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.outbox = outbox
        self.ring = RingWriter.from_spec(ring_spec, self.cache)
        self.first_token = first_token
        self._sent: dict[RequestState, _Sent] = {}
        self._by_key: dict[str, RequestState] = {}
        self._keys: dict[RequestState, str] = {}

    def enqueue(self, msg: dict[str, Any]) -> None:
        """Queue one ``prefill`` message's request (``key``, ``rid``, ``ids``, ``sampling``,
        ``delays``, ``trace``; ``sent_ns``: when the decode side sent it); a full queue or bad
        fields answer an ``error`` message. Its way here is a ``queue`` span of its own
        (``leg="dispatch"``, from ``sent_ns``), so its queue time is dispatch plus wait."""
        key = msg["key"]
        try:
            params = SamplingParams(**msg["sampling"])
            parent = remote_parent(msg["trace"], msg["rid"])
            # not on an event loop: deliver sends on the channel instead
            req = RequestState(msg["rid"], list(msg["ids"]), 1, params, dict(msg["delays"]),
                               parent, None, None)  # type: ignore[arg-type]
            req.generator = make_generator(params, self.model.device)
            self._by_key[key], self._keys[req] = req, key
            now_ns = clock_ns()
            # its way here is queueing too: from the decode side's send (one host, one clock)
            sent_ns = min(int(msg.get("sent_ns") or now_ns), now_ns)
            record("queue", sent_ns, now_ns, request_id=req.rid, parent=parent, leg="dispatch")
            self.queue(req, now_ns)
        except (QueueFull, ValueError, KeyError, TypeError) as exc:
            self._keys.pop(self._by_key.pop(key, None), None)  # type: ignore[arg-type]
            self.outbox.put({"op": "error", "key": key, "message": str(exc)})

    def cancel(self, key: str) -> None:
        """Cancel a request the decode side gave up (its worker frees it next iteration)."""
        req = self._by_key.get(key)
        if req is not None:
            req.cancelled = True
            self.wake()

    def _key(self, req: RequestState) -> str | None:
        return self._keys.get(req)

    def on_chunk_done(self, req: RequestState, end_ns: int) -> int:
        """Send the full blocks the chunk filled; after the last chunk, with the first
        token delivered from the decode side, every block left (``_send_rest``), so
        ``sample`` begins after that."""
        sent = self._sent.setdefault(req, _Sent())
        if req.computed < len(req.prompt_ids) or self.first_token != "decode":
            self._send(req, sent, req.computed // self.cache.block_size)
            return end_ns
        self._send_rest(req, sent)
        return clock_ns()

    def _send_rest(self, req: RequestState, sent: _Sent) -> None:
        """Every prompt block not sent yet, the injected ``kv_transfer`` delay before the
        last one."""
        total = -(-len(req.prompt_ids) // self.cache.block_size)
        self._send(req, sent, total - 1)
        sent.begin_ns = sent.begin_ns or clock_ns()
        sleep_for(req.delays_ms, "kv_transfer")
        self._send(req, sent, total)

    def _send(self, req: RequestState, sent: _Sent, upto: int) -> None:
        if upto <= sent.blocks or req.seq is None:
            return
        sent.begin_ns = sent.begin_ns or clock_ns()
        blocks = req.seq.blocks[sent.blocks : upto]
        header = {"op": "blocks", "key": self._key(req), "first": sent.blocks,
                  "count": upto - sent.blocks, "begin_ns": sent.begin_ns}
        if self.ring is not None:
            self.ring.send_blocks(self.outbox, blocks, header)
        else:
            self.outbox.put(header, pack_blocks(self.cache, blocks))
        sent.blocks = upto

    def deliver(self, req: RequestState, item: TokenItem | BaseException) -> None:
        """The first token on the channel, with the generator's state; with
        ``first_token="prefill"`` the blocks not sent yet follow it. (An error is sent by
        ``on_drop``, which forgets the request before ``Engine`` delivers it.)"""
        key = self._key(req)
        if key is None or isinstance(item, BaseException):
            return
        state = req.generator.get_state() if req.generator is not None else None
        header = {"op": "token", "key": key, "token": int(item[0]),
                  "sampled_ns": req.sampled_ns, "cached_tokens": req.cached_tokens}
        self.outbox.put(header, None if state is None else state.to(torch.uint8))
        if self.first_token != "decode":  # the token went first; the transfer follows
            self._send_rest(req, self._sent.setdefault(req, _Sent()))

    def on_drop(self, req: RequestState, error: BaseException | None) -> None:
        """Send ``error``, if any, and forget the request."""
        self._sent.pop(req, None)
        key = self._keys.pop(req, None)
        if key is None:
            return
        self._by_key.pop(key, None)
        if error is not None:
            self.outbox.put({"op": "error", "key": key, "message": str(error)})
