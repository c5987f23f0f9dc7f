"""Iteration-level (continuous) batching: one worker thread, chunked prefill, streaming.

As in vLLM and Sarathi-Serve, every iteration (``step``) is rebuilt from scratch: admit
waiting requests first come, first served while the K/V cache and ``max_running`` allow;
give the step's token budget to one decode token per decoding request first, then to
prefill chunks (each at most ``chunk_size``) of requests still prefilling, in admission
order; run each chunk with ``prefill_chunk`` and all decode tokens with one batched
``decode_step``; sample; hand tokens to each request's asyncio queue.

Threading: the worker thread owns the model, the ``PagedKVCache`` and the
``PrefixCache``. The asyncio side (``Engine.submit`` and ``RequestStream``) only
tokenizes, detokenizes, appends to the waiting queue under a lock and reads its own
``asyncio.Queue``: it never waits on model work. Tokens cross over with
``loop.call_soon_threadsafe``.

Tracing (DESIGN.md, "Stages"): per request ``tokenize`` and ``detokenize`` (of the first
token) on the asyncio side; ``queue``, ``schedule``, ``prefill`` with its
``prefill.chunk`` children, ``sample`` (of the first token) and the ``first_sampled``
event from the worker, recorded with explicit times under the request's span that was
current (or registered by ``request_context``) when it was submitted. Engine level: one
``step`` span per iteration in its own trace, linked to the requests it served, with a
``forward`` span per model call from ``instrument_module``. All times are host clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from ttft.engine.kv_cache import PagedKVCache, Seq
from ttft.engine.model import Transformer, decode_step, prefill_chunk
from ttft.engine.peaks import record_engine_info
from ttft.engine.prefix_cache import PrefixCache
from ttft.engine.sampler import SamplingParams, make_generator, sample, sample_batch
from ttft.engine.tokenizer import Tokenizer
from ttft.tracer import clock_ns, current_span, link_step, record, stage
from ttft.tracer import context as _ctx

__all__ = ["Engine", "EngineConfig", "EngineStopped", "QueueFull", "RequestStream", "TokenEvent"]

log = logging.getLogger(__name__)
DELAY_STAGES = ("tokenize", "queue", "schedule", "sample", "detokenize")
"""The stages ``inject_delay_ms`` can delay (each delay lands inside that stage's span)."""


class QueueFull(RuntimeError):
    """The waiting queue holds ``max_queue`` requests; retry later (HTTP 429)."""


class EngineStopped(RuntimeError):
    """The engine is not running (not started, or stopped while the request was live)."""


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler limits and the K/V cache shape.

    Attributes:
        max_batch_tokens: tokens one step may run (decode tokens plus prefill chunks).
        chunk_size: the most prompt tokens of one request in one step.
        max_queue: waiting requests beyond which ``submit`` raises ``QueueFull``.
        num_blocks, block_size: the paged K/V cache.
        max_running: requests admitted at once (prefilling or decoding).
        inject_delay_ms: known delays per stage (``tokenize``, ``queue``, ``schedule``,
            ``sample``, ``detokenize``), added to every request. ``tokenize`` and
            ``detokenize`` sleep on the request's own asyncio path; ``queue`` makes a
            request eligible for admission that much after its arrival (later requests
            may be admitted before it); ``schedule`` and ``sample`` sleep in the worker,
            so they delay the whole step.
    """

    max_batch_tokens: int = 512
    chunk_size: int = 256
    max_queue: int = 64
    num_blocks: int = 1024
    block_size: int = 16
    max_running: int = 16
    inject_delay_ms: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "chunk_size", "max_queue", "num_blocks", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.max_running <= self.max_batch_tokens:
            raise ValueError(
                f"max_running must be in 1..max_batch_tokens ({self.max_batch_tokens}), "
                f"got {self.max_running}"
            )
        _check_delays(self.inject_delay_ms)


def _check_delays(delays: dict[str, float]) -> None:
    bad = sorted(set(delays) - set(DELAY_STAGES))
    if bad:
        raise ValueError(f"inject_delay_ms: unknown stage(s) {bad}; choose from {DELAY_STAGES}")
    if any(v < 0 for v in delays.values()):
        raise ValueError(f"inject_delay_ms: delays must be >= 0, got {delays}")


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
    """

    token_id: int
    text: str
    finished: bool
    finish_reason: str | None
    usage: Usage


@dataclass(eq=False)
class _Request:
    rid: str
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    delays_ms: dict[str, float]
    parent: _ctx.SpanRef  # request-level spans nest under it
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrival_ns: int = 0
    eligible_ns: int = 0
    generator: torch.Generator | None = None
    seq: Seq | None = None
    queue_ref: _ctx.SpanRef | None = None
    cached_tokens: int = 0
    computed: int = 0  # prompt positions whose K/V is in seq
    out_ids: list[int] = field(default_factory=list)
    chunks: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)
    cancelled: bool = False


class RequestStream:
    """The tokens of one request as an async iterator of ``TokenEvent``.

    Closing it (``aclose``/``cancel``) or cancelling the task awaiting it cancels the
    request: the worker drops its K/V references at its next iteration. A request that
    fails or whose engine stops raises the error from ``__anext__``.
    """

    def __init__(self, engine: Engine, req: _Request) -> None:
        self._engine = engine
        self._req = req
        self._done = False
        self._ids: list[int] = []
        self._text = ""

    @property
    def request_id(self) -> str:
        return self._req.rid

    @property
    def queue_seconds(self) -> float | None:
        """How long the request waited for admission (its ``queue`` span), once admitted;
        None before that."""
        ref = self._req.queue_ref
        return None if ref is None else (ref.end_ns - ref.start_ns) / 1e9

    @property
    def admitted_ns(self) -> int | None:
        """When the request was admitted, in ``perf_counter_ns`` time; None before."""
        ref = self._req.queue_ref
        return None if ref is None else int(ref.end_ns)

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
        full = self._engine.tokenizer.decode(ids)
        text = ""
        if finished or not full.endswith("\ufffd"):  # hold a split multi-byte character
            text, self._text = full[len(self._text) :], full
        if len(ids) == 1:
            delay_ms = req.delays_ms.get("detokenize", 0.0)
            if delay_ms:
                await asyncio.sleep(delay_ms / 1e3)
            record("detokenize", t0_ns, clock_ns(), request_id=req.rid, parent=req.parent)
        if finished:
            self._done = True
        usage = Usage(len(req.prompt_ids), len(ids), cached)
        return TokenEvent(token_id, text, finished, reason, usage)

    def cancel(self) -> None:
        """Cancel the request (idempotent; nothing happens once it finished)."""
        if not self._done:
            self._done = True
            self._req.cancelled = True
            self._engine._wake.set()

    async def aclose(self) -> None:
        self.cancel()


class Engine:
    """Continuous batching over one ``Transformer`` in a background worker thread.

    ``start()`` before ``submit``; ``stop()`` ends the worker (or use ``with Engine(...)``).
    ``cache`` and ``prefix_cache`` belong to the worker: read them only for statistics.
    ``device_info`` is the device dict of the ``engine_info`` event once started.
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        config: EngineConfig | None = None,
        *,
        measure_peaks: bool | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.cache = PagedKVCache.for_model(model, self.config.num_blocks, self.config.block_size)
        self.prefix_cache = PrefixCache(self.cache)
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._hooks: Any = None
        self._step_ids = itertools.count()
        self.measure_peaks = measure_peaks
        self.device_info: dict[str, Any] | None = None

    def run_metadata(self) -> dict[str, Any]:
        """What a trace file should record about this engine (DESIGN.md: run metadata):
        device and its name, dtype, the model and engine configurations, torch version."""
        param = next(self.model.parameters())
        device = param.device
        return {
            "engine": {
                "device": str(device),
                "device_name": torch.cuda.get_device_name(device)
                if device.type == "cuda"
                else "cpu",
                "dtype": str(param.dtype).removeprefix("torch."),
                "model": dataclasses.asdict(self.model.config),
                "config": dataclasses.asdict(self.config),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
            }
        }

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Engine:
        """Instrument the model (``forward`` spans), record the ``engine_info`` event
        (model config and device, with peaks measured once per process when tracing is
        configured, unless ``measure_peaks`` says otherwise or ``TTFT_SKIP_PEAKS=1``; see
        ``ttft.engine.peaks``) and start the worker thread."""
        if self._thread is not None:
            raise RuntimeError("engine already started")
        from ttft.tracer.torch_hooks import instrument_module

        self._hooks = instrument_module(self.model)
        self.device_info = record_engine_info(self.model, self.measure_peaks)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ttft-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the worker, waiting at most ``timeout_s`` for its current step; live
        requests end with ``EngineStopped``. Idempotent."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("ttft engine: worker still busy after %.1f s", timeout_s)
        if self._hooks is not None:
            self._hooks.remove()
            self._hooks = None

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    # -- asyncio side -------------------------------------------------------------------

    async def submit(
        self,
        prompt: str | list[int],
        max_tokens: int = 16,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        inject_delay_ms: dict[str, float] | None = None,
    ) -> RequestStream:
        """Tokenize ``prompt`` (text, or token ids used as they are) and queue it.

        Args:
            max_tokens: the most tokens to generate (EOS ends earlier).
            sampling: default greedy.
            request_id: joins the request's trace (``request_context``); default a uuid.
            inject_delay_ms: per-request delays, overriding ``config.inject_delay_ms``.

        Returns:
            The request's token stream.

        Raises:
            QueueFull: ``config.max_queue`` requests are waiting.
            EngineStopped: the engine is not running.
            ValueError: empty prompt, bad ids, or a request that can never fit the model
                or the K/V cache.
        """
        if self._thread is None or self._stopping:
            raise EngineStopped("engine is not running; call start() first")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        rid = request_id or uuid.uuid4().hex
        delays = {**self.config.inject_delay_ms, **(inject_delay_ms or {})}
        _check_delays(delays)
        cur = current_span()
        parent = cur if cur is not None and cur.request_id == rid else _ctx.requests.get(rid)
        if parent is None:  # no open request context: the request gets a trace of its own
            parent = _ctx.SpanRef(_ctx.new_trace_id(), 0, rid)

        t0_ns = clock_ns()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if delays.get("tokenize"):
            await asyncio.sleep(delays["tokenize"] / 1e3)
        record("tokenize", t0_ns, clock_ns(), request_id=rid, parent=parent, prompt_tokens=len(ids))
        self._validate(ids, max_tokens)

        loop = asyncio.get_running_loop()
        req = _Request(
            rid,
            ids,
            max_tokens,
            sampling or SamplingParams(),
            delays,
            parent,
            loop,
            asyncio.Queue(),
        )
        req.generator = make_generator(req.params, self.model.device)
        with self._lock:
            if len(self._waiting) >= self.config.max_queue:
                raise QueueFull(
                    f"waiting queue full ({self.config.max_queue} requests); retry later"
                )
            req.arrival_ns = clock_ns()
            req.eligible_ns = req.arrival_ns + int(delays.get("queue", 0.0) * 1e6)
            self._waiting.append(req)
        self._wake.set()
        return RequestStream(self, req)

    def _validate(self, ids: list[int], max_tokens: int) -> None:
        if not ids:
            raise ValueError("empty prompt")
        vocab = self.model.config.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise ValueError(f"prompt token ids must be in 0..{vocab - 1}")
        total, limit = len(ids) + max_tokens, self.model.config.max_seq_len
        if total > limit:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
                f"max_seq_len {limit}"
            )
        if self._blocks_for(total) > self.config.num_blocks:
            raise ValueError(f"{total} positions never fit {self.config.num_blocks} K/V blocks")

    # -- worker -------------------------------------------------------------------------

    def _blocks_for(self, positions: int) -> int:
        return -(-positions // self.config.block_size)

    def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                self._reap()
                self._admit()
                if self._running:
                    self._step()
                    continue
            except Exception as e:
                log.exception("ttft engine: step failed; failing its requests")
                for req in list(self._running):
                    self._drop(req, e)
                continue
            self._wake.wait(self._idle_timeout_s())
        err = EngineStopped("engine stopped")
        with self._lock:
            waiting, self._waiting = list(self._waiting), deque()
        for req in waiting + self._running:
            self._drop(req, err)

    def _idle_timeout_s(self) -> float | None:
        with self._lock:
            due = [r.eligible_ns for r in self._waiting if not r.cancelled]
        return max(0.0, (min(due) - clock_ns()) / 1e9) if due else None

    def _drop(self, req: _Request, error: BaseException | None) -> None:
        """Free ``req``'s K/V now and forget it; tell its stream ``error`` if any."""
        if req.seq is not None:
            self._record_prefill(req)
            self.cache.free(req.seq)
            req.seq = None
        if req in self._running:
            self._running.remove(req)
        if error is not None:
            self._deliver(req, error)

    def _reap(self) -> None:
        with self._lock:
            gone = [r for r in self._waiting if r.cancelled]
            for req in gone:
                self._waiting.remove(req)
        for req in gone:
            record(
                "queue",
                req.arrival_ns,
                clock_ns(),
                request_id=req.rid,
                parent=req.parent,
                cancelled=True,
            )
        for req in [r for r in self._running if r.cancelled]:
            self._drop(req, None)

    def _admit(self) -> None:
        with self._lock:
            candidates = list(self._waiting)
        now_ns = clock_ns()
        for req in candidates:
            if len(self._running) >= self.config.max_running:
                break
            if req.eligible_ns > now_ns:
                continue  # an injected queue delay holds only this request back
            if not self._try_admit(req):
                break  # FCFS: nobody overtakes a request waiting for K/V room
            with self._lock:
                self._waiting.remove(req)

    def _try_admit(self, req: _Request) -> bool:
        t0_ns = clock_ns()
        pc = self.prefix_cache
        blocks, cached = pc.match(req.prompt_ids)
        seq = Seq()
        pc.attach(seq, blocks, cached)
        # Reserve every block a request can still grow into, so no step hits CacheFull.
        owed = sum(
            self._blocks_for(len(r.prompt_ids) + r.max_tokens) - len(r.seq.blocks)
            for r in self._running
        )
        need = self._blocks_for(len(req.prompt_ids) + req.max_tokens) - len(seq.blocks)
        if not pc.ensure_free(owed + need):
            self.cache.free(seq)
            return False
        req.seq, req.cached_tokens, req.computed = seq, cached, cached
        req.queue_ref = record(
            "queue", req.arrival_ns, t0_ns, request_id=req.rid, parent=req.parent
        )
        if req.delays_ms.get("schedule"):
            time.sleep(req.delays_ms["schedule"] / 1e3)
        record(
            "schedule",
            t0_ns,
            clock_ns(),
            request_id=req.rid,
            parent=req.parent,
            prompt_tokens=len(req.prompt_ids),
            cached_tokens=cached,
        )
        self._running.append(req)
        return True

    def _step(self) -> None:
        step_id = next(self._step_ids)
        budget = self.config.max_batch_tokens
        decode = [r for r in self._running if r.out_ids][:budget]
        budget -= len(decode)
        chunks: list[tuple[_Request, int]] = []
        for req in self._running:
            if req.out_ids or budget <= 0:
                continue
            n = min(self.config.chunk_size, len(req.prompt_ids) - req.computed, budget)
            chunks.append((req, n))
            budget -= n
        served = [r for r, _ in chunks] + decode
        prefill_tokens = sum(n for _, n in chunks)
        with stage(
            "step",
            step_id=step_id,
            prefill_tokens=prefill_tokens,
            decode_tokens=len(decode),
            running=len(self._running),
        ) as span:
            self._link(span, served)
            for req, n in chunks:
                self._prefill(req, n, step_id)
            if decode:
                logits = decode_step(
                    self.model, self.cache, [r.seq for r in decode], [r.out_ids[-1] for r in decode]
                )  # (B, V)
                tokens = sample_batch(
                    logits, [r.params for r in decode], [r.generator for r in decode]
                )
                for req, token in zip(decode, tokens, strict=True):
                    self._emit(req, token)

    def _link(self, span: stage, reqs: list[_Request]) -> None:
        link_step(span, [r.rid for r in reqs])
        linked = {attrs["request_id"] for _, _, attrs in span.links or ()}
        for req in reqs:
            if req.rid not in linked:  # no open span with an id: link its queue span
                ref = req.parent if req.parent.span_id else req.queue_ref
                if ref is not None:
                    span.links.append((ref.trace_id, ref.span_id, {"request_id": req.rid}))

    def _prefill(self, req: _Request, n: int, step_id: int) -> None:
        t0_ns = clock_ns()
        chunk = req.prompt_ids[req.computed : req.computed + n]
        logits = prefill_chunk(self.model, self.cache, req.seq, chunk)  # (V,)
        req.computed += n
        attrs = dict(
            step_id=step_id,
            chunk_tokens=n,
            cached_tokens=req.cached_tokens,
            context_tokens=req.seq.length,
        )
        req.chunks.append((t0_ns, clock_ns(), attrs))
        if req.computed < len(req.prompt_ids):
            return
        self._record_prefill(req)
        self.prefix_cache.insert(req.prompt_ids, req.seq)
        t0_ns = clock_ns()
        token = sample(logits, req.params, req.generator)
        if req.delays_ms.get("sample"):
            time.sleep(req.delays_ms["sample"] / 1e3)
        t1_ns = clock_ns()
        ref = record("sample", t0_ns, t1_ns, request_id=req.rid, parent=req.parent, token_id=token)
        record("first_sampled", t1_ns, t1_ns, request_id=req.rid, parent=ref, stage_name="event")
        self._emit(req, token)

    def _record_prefill(self, req: _Request) -> None:
        """The ``prefill`` envelope and its chunks (once, when prefill ends or is cut)."""
        if not req.chunks:
            return
        ref = record(
            "prefill",
            req.chunks[0][0],
            req.chunks[-1][1],
            request_id=req.rid,
            parent=req.parent,
            cached_tokens=req.cached_tokens,
            chunks=len(req.chunks),
        )
        for t0_ns, t1_ns, attrs in req.chunks:
            record("prefill.chunk", t0_ns, t1_ns, request_id=req.rid, parent=ref, **attrs)
        req.chunks = []

    def _emit(self, req: _Request, token: int) -> None:
        req.out_ids.append(token)
        reason = None
        if token == self.tokenizer.eos_id:
            reason = "stop"
        elif len(req.out_ids) >= req.max_tokens:
            reason = "length"
        item = (token, reason is not None, reason, req.cached_tokens)
        self._deliver(req, item)
        if reason is not None:
            self.prefix_cache.insert(req.prompt_ids + req.out_ids, req.seq)
            self._drop(req, None)

    def _deliver(self, req: _Request, item: Any) -> None:
        try:
            req.loop.call_soon_threadsafe(req.queue.put_nowait, item)
        except RuntimeError:  # the request's event loop is closed: nobody is listening
            req.cancelled = True
