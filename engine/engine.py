"""``Engine``: iteration-level (continuous) batching in one worker thread, with chunked
prefill and streaming, configured by ``ttft.engine.config.EngineConfig``; ``EngineStopped``.

Every iteration the worker drops cancelled requests, plans the step with
``ttft.engine.policy.plan_step`` (preemptions, admissions, prefill chunks, decode tokens),
preempts, admits, runs each chunk with ``prefill_chunk`` and all decode tokens with one
batched ``decode_step``, samples, and hands tokens to each request's stream
(``ttft.engine.stream``). With ``EngineConfig.preemption="recompute"`` a preempted request
frees its blocks and waits at the front of the queue; admitted again, it prefills its
prompt and the tokens it had generated (``RequestState.context_ids``), and the next token
comes from that prefill's last logits, so its output is what it would have been.

Threading: the worker thread owns the model, the ``PagedKVCache`` and the
``PrefixCache``. The asyncio side (``Engine.submit`` and ``RequestStream``) only
tokenizes, detokenizes, appends to the waiting queue under a lock and reads its own
``asyncio.Queue``: it never waits on model work. Tokens cross over with
``loop.call_soon_threadsafe``. The waiting queue is ``ttft.engine.waiting``'s.
Extensions (``ttft.engine.disagg``) use the hooks and methods of ``ttft.engine.hooks``.

Tracing: the request-level spans and the ``step`` span's links are recorded as
``ttft.engine.spans`` says; one ``step`` span per iteration, in the engine's own trace,
with a ``forward`` span per model call from ``instrument_module``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ttft.engine.admission import check_fits, prompt_ids
from ttft.engine.config import EngineConfig
from ttft.engine.faults import async_sleep_for, merge_delays, sleep_for
from ttft.engine.hooks import EngineHooks
from ttft.engine.kv_cache import PagedKVCache
from ttft.engine.model import Transformer, decode_step, prefill_chunk
from ttft.engine.peaks import engine_metadata, record_engine_info
from ttft.engine.policy import StepPlan, plan_step
from ttft.engine.prefix_cache import PrefixCache
from ttft.engine.reservation import Reservations
from ttft.engine.sampler import SamplingParams, make_generator, sample
from ttft.engine.spans import (
    begin_preempted,
    link_served,
    note_chunk,
    record_batch_wait,
    record_preempted,
    record_prefill,
    record_queue,
    record_sample,
    record_schedule,
)
from ttft.engine.stream import RequestState, RequestStream
from ttft.engine.tokenizer import Tokenizer
from ttft.engine.waiting import QueueFull, WaitingQueue
from ttft.tracer import clock_ns, record, stage
from ttft.tracer.context import new_request_root, request_parent

__all__ = ["Engine", "EngineStopped", "QueueFull"]

log = logging.getLogger(__name__)


class EngineStopped(RuntimeError):
    """The engine is not running (not started, or stopped while the request was live)."""


class Engine(EngineHooks):
    """Continuous batching over one ``Transformer`` in a background worker thread.

    ``start()`` before ``submit``; ``stop()`` ends the worker (or use ``with Engine(...)``).
    ``cache`` and ``prefix_cache`` belong to the worker: read them only for statistics.
    ``device_info`` is the device dict of the ``engine_info`` event once started;
    ``preemptions`` counts the requests preempted so far.
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
        self._kv = Reservations(self.prefix_cache, self.config.preemption == "recompute")
        self._waiting = WaitingQueue(self.config.max_queue)
        self._running: list[RequestState] = []
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._forward_hooks: Any = None
        self._next_step_id = 0
        self.preemptions = 0
        self.measure_peaks = measure_peaks
        self.device_info: dict[str, Any] | None = None

    def run_metadata(self) -> dict[str, Any]:
        """What a trace file should record about this engine (docs/design.md: run metadata),
        under ``engine``: ``ttft.engine.peaks.engine_metadata``."""
        return {"engine": engine_metadata(self.model, self.config)}

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Engine:
        """Instrument the model (``forward`` spans), record the ``engine_info`` event
        (model config and device, with peaks measured once per process when tracing is
        configured, unless ``measure_peaks`` says otherwise or ``TTFT_SKIP_PEAKS=1``; see
        ``ttft.engine.peaks``) and start the worker thread."""
        if self._thread is not None:
            raise RuntimeError("engine already started")
        from ttft.tracer.torch_hooks import instrument_module

        self._forward_hooks = instrument_module(self.model)
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
        if self._forward_hooks is not None:
            self._forward_hooks.remove()
            self._forward_hooks = None

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
        """Tokenize ``prompt`` (text, or token ids used as they are) and queue it; a long
        text is tokenized off the event loop (``ttft.engine.admission.prompt_ids``).

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
            ValueError: empty prompt, text that is not valid Unicode, bad ids, or a request
                that can never fit the model or the K/V cache.
        """
        if self._thread is None or self._stopping:
            raise EngineStopped("engine is not running; call start() first")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        rid = request_id or uuid.uuid4().hex
        delays = merge_delays(self.config.inject_delay_ms, inject_delay_ms)
        # no open span of the request: it gets a trace of its own
        parent = request_parent(rid) or new_request_root(rid)

        t0_ns, ids = clock_ns(), []
        try:  # tokenize ends where the queue begins: the checks and the state are its part
            limit = self.model.config.max_seq_len
            ids = await prompt_ids(self.tokenizer, prompt, max_tokens, limit)
            await async_sleep_for(delays, "tokenize")
            check_fits(ids, max_tokens, self.model.config, self.cache)
            params = sampling or SamplingParams()
            loop = asyncio.get_running_loop()
            req = RequestState(rid, ids, max_tokens, params, delays, parent, loop, asyncio.Queue())
            req.generator = make_generator(params, self.model.device)
        finally:
            ready_ns = clock_ns()
            record(
                "tokenize", t0_ns, ready_ns, request_id=rid, parent=parent, prompt_tokens=len(ids)
            )
        self.queue(req, ready_ns)
        return RequestStream(req, self.tokenizer, self.wake)

    def queue(self, req: RequestState, ready_ns: int) -> None:
        """Append ``req``, ready at ``ready_ns``, to the waiting queue and wake the worker;
        ``QueueFull`` when ``config.max_queue`` requests are waiting. Not on the worker
        thread; an extension may override it (``ttft.engine.hooks``)."""
        self._waiting.put(req, ready_ns)
        self._wake.set()

    def wake(self) -> None:
        """Have the worker run an iteration soon (any thread)."""
        self._wake.set()

    # -- worker: one iteration ----------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                if self._iterate():
                    continue
            except Exception as e:  # not one request's doing (those fail alone in _step)
                log.exception("ttft engine: step failed; failing its requests")
                for req in list(self._running):
                    self._drop(req, e)
                continue
            self._wake.wait(self._waiting.next_due_s())
        err = EngineStopped("engine stopped")
        for req in self._waiting.take_all() + self._running:
            self._drop(req, err)

    def _iterate(self) -> bool:
        """Drop cancelled requests, plan, admit and run the step; whether anything ran or
        changed (a hook's ``on_iteration``, an admission, a step)."""
        self._reap()
        moved = self.on_iteration()
        plan = self._plan()
        self._preempt(plan.preempt)
        self._admit(plan.admit)
        if not self.runs_prefill:  # their K/V arrives from elsewhere
            plan = replace(plan, prefill=())
        if not plan.prefill and not plan.decode:  # nothing running, or nothing it can run
            return moved or bool(plan.admit)
        if self._kv.preempt:  # the decoding requests' next blocks (the plan made room)
            self._kv.reserve(self._running)
        self._step(plan)
        return True

    def _reap(self) -> None:
        for req in self._waiting.take_cancelled():  # its queue or preempted span ends
            (record_preempted if req.preempted_ns else record_queue)(
                req, clock_ns(), cancelled=True)
        for req in [r for r in self._running if r.cancelled]:
            self._drop(req, None)

    def _plan(self) -> StepPlan[RequestState]:
        config, kv = self.config, self._kv
        running = [kv.running(r) for r in self._running]
        head = self._waiting.head(config.max_running - len(running))
        waiting = [kv.waiting(req, eligible) for req, eligible in head]
        needed = any(w.eligible for w in waiting) or any(r.grow_blocks for r in running)
        free = kv.free_blocks() if needed else 0
        return plan_step(waiting, running, free_blocks=free, max_running=config.max_running,
                         max_batch_tokens=config.max_batch_tokens, chunk_size=config.chunk_size,
                         preempt=kv.preempt)

    def _admit(self, reqs: Sequence[RequestState]) -> None:
        """Admit the plan's requests in order: each takes its prefix-cache hit (unchanged
        since the plan looked); with the last one, the running requests' owed blocks are
        reserved (``ttft.engine.reservation``). A preempted request's wait ends its
        ``preempted`` span, a new one's its ``queue`` span. Then ``on_admit`` for each."""
        self._waiting.take(reqs)
        for req in reqs:
            t0_ns = clock_ns()
            hit = self._kv.take_prefix(req)
            self._running.append(req)
            if req is reqs[-1]:
                self._kv.reserve(self._running)
            resumed: dict[str, int] = {}
            if req.preempted_ns:  # admitted again: its preempted span ends
                req.queue_ref = record_preempted(req, t0_ns)
                resumed = dict(recompute_tokens=len(req.context_ids), recompute_cached_tokens=hit)
            else:
                req.admitted_ns, req.queue_ref = t0_ns, record_queue(req, t0_ns)
            sleep_for(req.delays_ms, "schedule")
            record_schedule(req, t0_ns, **resumed)
        for req in reqs:
            self.on_admit(req)

    def _preempt(self, pairs: Sequence[tuple[RequestState, RequestState]]) -> None:
        """Preempt each ``(request, needed by)`` of the plan: its ``preempted`` span begins
        (naming the request whose next block needed its blocks and the step about to run),
        its blocks are freed and it goes back to the front of the waiting queue."""
        for req, needed_by in pairs:
            begin_preempted(req, clock_ns(), preempted_by=[needed_by.rid],
                            step_id=self._next_step_id, generated_tokens=len(req.out_ids))
            req.preempted_attrs["blocks_freed"] = self._kv.release(req)
            self._running.remove(req)
            self.preemptions += 1
            self._waiting.put_front(req)

    def _step(self, plan: StepPlan[RequestState]) -> None:
        step_id, self._next_step_id = self._next_step_id, self._next_step_id + 1
        decode = list(plan.decode)
        served = [r for r, _ in plan.prefill] + decode
        prefill_tokens = sum(n for _, n in plan.prefill)
        with stage("step", step_id=step_id, prefill_tokens=prefill_tokens,
                   decode_tokens=len(decode), running=len(self._running)) as span:
            link_served(span, served)
            if plan.preempt:
                span.set(preempted_request_ids=[r.rid for r, _ in plan.preempt])
            for req, n in plan.prefill:
                self._isolated(req, self._prefill, req, n, step_id)
            if decode:
                logits = decode_step(
                    self.model, self.cache, [r.seq for r in decode], [r.out_ids[-1] for r in decode]
                )  # (B, V)
                for req, row in zip(decode, logits, strict=True):
                    self._isolated(req, self._sample_next, req, row)

    def _isolated(self, req: RequestState, work: Any, *args: Any) -> None:
        """``work(*args)``, one request's part of a step: its failure fails ``req`` alone."""
        try:
            work(*args)
        except Exception as e:
            log.exception("ttft engine: request %s failed in its step", req.rid)
            self._drop(req, e)

    def _sample_next(self, req: RequestState, logits: Any) -> None:
        self.emit(req, sample(logits, req.params, req.generator))

    # -- worker: a request's work -------------------------------------------------------

    def _prefill(self, req: RequestState, n: int, step_id: int) -> None:
        t0_ns, context = clock_ns(), req.context_ids
        chunk = context[req.computed : req.computed + n]
        logits = prefill_chunk(self.model, self.cache, req.seq, chunk)  # (V,)
        req.computed += n
        end_ns = note_chunk(req, t0_ns, n, step_id)
        record_batch_wait(req, t0_ns, step_id=step_id)  # its first chunk: the wait ends
        end_ns = self.on_chunk_done(req, end_ns)
        if req.computed < len(context):
            return
        record_prefill(req)
        if req.out_ids:  # a recompute after its first token: the next token, as a decode
            self._sample_next(req, logits)
            if req.seq is not None:
                self.prefix_cache.insert(context, req.seq)
            return
        token = sample(logits, req.params, req.generator)  # sampling begins at the logits
        sleep_for(req.delays_ms, "sample")
        record_sample(req, end_ns, clock_ns(), token)
        self.emit(req, token)  # the first token goes out before the cache bookkeeping
        if req.seq is not None:  # still running (a finished one inserted its whole sequence)
            self.prefix_cache.insert(req.prompt_ids, req.seq)

    def emit(self, req: RequestState, token: int) -> None:
        """Running ``req``'s next token (``deliver``); EOS or its ``max_tokens``-th token
        finishes it (its sequence into the prefix cache, then dropped). Worker thread."""
        req.out_ids.append(token)
        reason = None
        if token == self.tokenizer.eos_id:
            reason = "stop"
        elif len(req.out_ids) >= req.max_tokens:
            reason = "length"
        item = (token, reason is not None, reason, req.cached_tokens)
        self.deliver(req, item)
        if reason is not None:
            self.prefix_cache.insert(req.prompt_ids + req.out_ids, req.seq)
            self._drop(req, None)

    def drop(self, req: RequestState, error: BaseException | None = None) -> None:
        """End ``req`` now, running (its K/V freed) or waiting (taken out of the queue);
        ``error``, if any, is delivered to it. Nothing when it is neither. Worker thread."""
        if req in self._running or self._waiting.discard(req):
            self._drop(req, error)

    def _drop(self, req: RequestState, error: BaseException | None) -> None:
        """``on_drop``, then free ``req``'s K/V now and forget it; deliver ``error`` if any."""
        self.on_drop(req, error)
        if req.seq is not None:
            record_batch_wait(req, clock_ns(), dropped=True)
            record_prefill(req)
            self.cache.free(req.seq)
            req.seq = None
        if req in self._running:
            self._running.remove(req)
        if error is not None:
            self.deliver(req, error)
