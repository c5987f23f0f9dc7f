"""``Engine``: iteration-level (continuous) batching in one worker thread, with chunked
prefill and streaming, configured by ``ttft.engine.config.EngineConfig``; and its refusals
(``QueueFull``, ``EngineStopped``).

Every iteration the worker drops cancelled requests, plans the step with
``ttft.engine.policy.plan_step`` (admissions, prefill chunks, decode tokens), admits, runs
each chunk with ``prefill_chunk`` and all decode tokens with one batched ``decode_step``,
samples, and hands tokens to each request's stream (``ttft.engine.stream``).

Threading: the worker thread owns the model, the ``PagedKVCache`` and the
``PrefixCache``. The asyncio side (``Engine.submit`` and ``RequestStream``) only
tokenizes, detokenizes, appends to the waiting queue under a lock and reads its own
``asyncio.Queue``: it never waits on model work. Tokens cross over with
``loop.call_soon_threadsafe``.

Tracing: the request-level spans and the ``step`` span's links are recorded as
``ttft.engine.spans`` says; one ``step`` span per iteration, in the engine's own trace,
with a ``forward`` span per model call from ``instrument_module``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any

from ttft.engine.admission import prompt_ids, too_long
from ttft.engine.config import EngineConfig
from ttft.engine.faults import async_sleep_for, delay_ns, merge_delays, sleep_for
from ttft.engine.kv_cache import PagedKVCache
from ttft.engine.model import Transformer, decode_step, prefill_chunk
from ttft.engine.peaks import engine_metadata, record_engine_info
from ttft.engine.policy import StepPlan, Waiting, plan_step
from ttft.engine.prefix_cache import PrefixCache
from ttft.engine.reservation import Reservations
from ttft.engine.sampler import SamplingParams, make_generator, sample
from ttft.engine.spans import (
    link_served,
    note_chunk,
    record_batch_wait,
    record_prefill,
    record_queue,
    record_sample,
    record_schedule,
)
from ttft.engine.stream import RequestState, RequestStream
from ttft.engine.tokenizer import Tokenizer
from ttft.tracer import clock_ns, record, stage
from ttft.tracer.context import new_request_root, request_parent

__all__ = ["Engine", "EngineStopped", "QueueFull"]

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """The waiting queue holds ``max_queue`` requests; retry later (HTTP 429)."""


class EngineStopped(RuntimeError):
    """The engine is not running (not started, or stopped while the request was live)."""


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
        self._kv = Reservations(self.prefix_cache)
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._hooks: Any = None
        self._step_ids = itertools.count()
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
            self._validate(ids, max_tokens)
            params = sampling or SamplingParams()
            loop = asyncio.get_running_loop()
            req = RequestState(rid, ids, max_tokens, params, delays, parent, loop, asyncio.Queue())
            req.generator = make_generator(params, self.model.device)
        finally:
            ready_ns = clock_ns()
            record(
                "tokenize", t0_ns, ready_ns, request_id=rid, parent=parent, prompt_tokens=len(ids)
            )
        self._enqueue(req, ready_ns)
        return RequestStream(req, self.tokenizer, self._wake.set)

    def _enqueue(self, req: RequestState, ready_ns: int) -> None:
        """Append ``req``, ready at ``ready_ns``, to the waiting queue and wake the worker;
        ``QueueFull`` when ``config.max_queue`` requests are waiting."""
        with self._lock:
            if len(self._waiting) >= self.config.max_queue:
                raise QueueFull(
                    f"waiting queue full ({self.config.max_queue} requests); retry later"
                )
            req.arrival_ns = ready_ns
            req.eligible_ns = req.arrival_ns + delay_ns(req.delays_ms, "queue")
            self._waiting.append(req)
        self._wake.set()

    def _validate(self, ids: list[int], max_tokens: int) -> None:
        if not ids:
            raise ValueError("empty prompt")
        vocab = self.model.config.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise ValueError(f"prompt token ids must be in 0..{vocab - 1}")
        total, limit = len(ids) + max_tokens, self.model.config.max_seq_len
        if total > limit:
            raise too_long(str(len(ids)), max_tokens, limit)
        if self._kv.blocks_for(total) > self.config.num_blocks:
            raise ValueError(f"{total} positions never fit {self.config.num_blocks} K/V blocks")

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
            self._wake.wait(self._idle_timeout_s())
        err = EngineStopped("engine stopped")
        with self._lock:
            waiting, self._waiting = list(self._waiting), deque()
        for req in waiting + self._running:
            self._drop(req, err)

    def _iterate(self) -> bool:
        """Drop cancelled requests, plan, admit and run the step; whether a step ran."""
        self._reap()
        plan = self._plan()
        self._admit(plan.admit)
        if not self._running:
            return False
        self._step(plan)
        return True

    def _idle_timeout_s(self) -> float | None:
        with self._lock:
            due = [r.eligible_ns for r in self._waiting if not r.cancelled]
        return max(0.0, (min(due) - clock_ns()) / 1e9) if due else None

    def _reap(self) -> None:
        with self._lock:
            gone = [r for r in self._waiting if r.cancelled]
            for req in gone:
                self._waiting.remove(req)
        for req in gone:
            record_queue(req, clock_ns(), cancelled=True)
        for req in [r for r in self._running if r.cancelled]:
            self._drop(req, None)

    def _plan(self) -> StepPlan[RequestState]:
        config, kv = self.config, self._kv
        running = [kv.running(r) for r in self._running]
        waiting = self._candidates(config.max_running - len(running))
        free = kv.free_blocks() if any(w.eligible for w in waiting) else 0
        return plan_step(waiting, running, free_blocks=free, max_running=config.max_running,
                         max_batch_tokens=config.max_batch_tokens, chunk_size=config.chunk_size)

    def _candidates(self, slots: int) -> list[Waiting[RequestState]]:
        """The waiting queue up to its ``slots``-th eligible request (the plan admits no
        more), as the policy sees it."""
        with self._lock:
            queue = list(self._waiting)
        now_ns, found = clock_ns(), 0
        out: list[Waiting[RequestState]] = []
        for req in queue:
            if found >= slots:
                break
            out.append(self._kv.waiting(req, eligible=req.eligible_ns <= now_ns))
            found += out[-1].eligible
        return out

    def _admit(self, reqs: Sequence[RequestState]) -> None:
        """Admit the plan's requests in order: each takes its prefix-cache hit (unchanged
        since the plan looked); with the last one, the running requests' owed blocks are
        reserved (``ttft.engine.reservation``)."""
        with self._lock:
            for req in reqs:
                self._waiting.remove(req)
        for req in reqs:
            t0_ns = clock_ns()
            self._kv.take_prefix(req)
            self._running.append(req)
            if req is reqs[-1]:
                self._kv.reserve(self._running)
            req.admitted_ns, req.queue_ref = t0_ns, record_queue(req, t0_ns)
            sleep_for(req.delays_ms, "schedule")
            record_schedule(req, t0_ns)

    def _step(self, plan: StepPlan[RequestState]) -> None:
        step_id = next(self._step_ids)
        decode = list(plan.decode)
        served = [r for r, _ in plan.prefill] + decode
        prefill_tokens = sum(n for _, n in plan.prefill)
        with stage("step", step_id=step_id, prefill_tokens=prefill_tokens,
                   decode_tokens=len(decode), running=len(self._running)) as span:
            link_served(span, served)
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
        self._emit(req, sample(logits, req.params, req.generator))

    # -- worker: a request's work -------------------------------------------------------

    def _prefill(self, req: RequestState, n: int, step_id: int) -> None:
        t0_ns = clock_ns()
        chunk = req.prompt_ids[req.computed : req.computed + n]
        logits = prefill_chunk(self.model, self.cache, req.seq, chunk)  # (V,)
        req.computed += n
        end_ns = note_chunk(req, t0_ns, n, step_id)
        record_batch_wait(req, t0_ns, step_id=step_id)  # its first chunk: the wait ends
        end_ns = self._chunk_done(req, end_ns)
        if req.computed < len(req.prompt_ids):
            return
        record_prefill(req)
        token = sample(logits, req.params, req.generator)  # sampling begins at the logits
        sleep_for(req.delays_ms, "sample")
        record_sample(req, end_ns, clock_ns(), token)
        self._emit(req, token)  # the first token goes out before the cache bookkeeping
        if req.seq is not None:  # still running (a finished one inserted its whole sequence)
            self.prefix_cache.insert(req.prompt_ids, req.seq)

    def _chunk_done(self, req: RequestState, end_ns: int) -> int:
        """After each prefill chunk of ``req`` (ended at ``end_ns``), where a disaggregated
        prefill worker sends its K/V blocks; returns when ``sample`` may begin."""
        return end_ns

    def _emit(self, req: RequestState, token: int) -> None:
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

    def _drop(self, req: RequestState, error: BaseException | None) -> None:
        """Free ``req``'s K/V now and forget it; tell its stream ``error`` if any."""
        if req.seq is not None:
            record_batch_wait(req, clock_ns(), dropped=True)
            record_prefill(req)
            self.cache.free(req.seq)
            req.seq = None
        if req in self._running:
            self._running.remove(req)
        if error is not None:
            self._deliver(req, error)

    def _deliver(self, req: RequestState, item: Any) -> None:
        try:
            req.loop.call_soon_threadsafe(req.queue.put_nowait, item)
        except RuntimeError:  # the request's event loop is closed: nobody is listening
            req.cancelled = True
