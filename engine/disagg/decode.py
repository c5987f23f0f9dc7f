"""``DisaggEngine``: disaggregated prefill and decode. This process (the API server's) is
the decode worker; a ``PrefillEngine`` in a child process (``WorkerProcess``) prefills.

A request is tokenized here, then sent to the prefill worker and queued here at once, as
SGLang's router sends it to both sides: the decode worker admits it (its ``queue`` span,
its K/V reserved) while the prefill worker queues and prefills it. The prefill worker
sends each chunk's finished K/V blocks as the chunk ends (in the socket's payload, or
through a shared-memory ring: ``kv_channel``); a receiver thread here installs them in the
request's blocks of the paged cache as they arrive (blocks that came before
the request was admitted, at its admission; blocks its own prefix cache holds already are
skipped). The decode worker thread, which owns the cache otherwise, never reads those
blocks before the transfer is complete: once every prompt block is installed and the
first token is known, the request decodes in the batch like any other.

First token (``first_token``): ``decode`` (the default) delivers it once the transfer is
installed, so TTFT includes the transfer; ``prefill`` delivers it as it arrives from the
prefill worker, so the transfer lies after TTFT and shows in the second token's time.

Spans here: ``tokenize``, ``queue`` and ``schedule`` of the decode side (no ``batch_wait``:
its wait after admission is the transfer), ``kv_transfer`` (attributes ``ttft.kv.blocks``,
``ttft.kv.bytes`` and ``ttft.kv.first_token``, the first-token mode, so a trace says it
without run metadata) from the prefill worker's ``begin_ns`` (the first block handed to
its channel, on its clock: one host shares the clock, another host needs the clocks
aligned) to the last block installed, and the ``step`` spans; ``deliver`` starts at the
prefill worker's ``first_sampled``. The worker's spans come over the channel and go to
``span_sink`` (the server's recorder), in the worker's clock domain and service.

It changes ``Engine`` only through its hooks (``ttft.engine.hooks``): ``queue`` also sends
the request to the prefill worker, ``runs_prefill`` is False (steps run decode tokens
only), ``on_admit`` allocates an admitted request's prompt blocks for the transfer,
``on_iteration`` finishes complete transfers and gives up failed ones, and ``on_drop``
forgets a request's transfer before its blocks are freed.

Failure: when the prefill worker dies, every request still waiting for it ends with
``EngineStopped`` (HTTP 503) and so does every later ``submit``; requests already decoding
finish. ``stop`` stops the worker process too (killed when it does not exit in time).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

import torch

from ttft.engine.config import EngineConfig
from ttft.engine.disagg.channel import ChannelClosed, block_bytes, install_blocks, recv_header
from ttft.engine.disagg.inbound import Inbound, finish_reason
from ttft.engine.disagg.prefill import trace_fields
from ttft.engine.disagg.process import WorkerProcess
from ttft.engine.disagg.shm import DEFAULT_RING_BYTES, ShmRing, blocks_source, check_channel
from ttft.engine.disagg.span_wire import rebuild
from ttft.engine.engine import Engine, EngineStopped
from ttft.engine.model import Transformer
from ttft.engine.stream import RequestState
from ttft.engine.tokenizer import Tokenizer
from ttft.tracer import clock_ns, record
from ttft.tracer.schema import ATTR_KV_BLOCKS, ATTR_KV_BYTES, ATTR_KV_FIRST_TOKEN

__all__ = ["API_SIDE_DELAYS", "FIRST_TOKEN_MODES", "DisaggEngine"]

log = logging.getLogger(__name__)

FIRST_TOKEN_MODES = ("decode", "prefill")
"""Where the first token is delivered from (``DisaggEngine.first_token``)."""
API_SIDE_DELAYS = frozenset({"tokenize", "detokenize"})
"""Injected delays applied here; the others go to the prefill worker."""


class DisaggEngine(Engine):
    """``Engine``'s interface (``submit``, ``start``, ``stop``) over a decode worker here
    and a prefill worker process.

    Args:
        model, tokenizer, config: as for ``Engine``; the worker builds the same model from
            ``model.config`` and ``seed``, on the same device.
        seed: the seed ``model``'s weights were drawn from.
        first_token: ``decode`` or ``prefill`` (module docstring).
        host: the channel's address (loopback by default).
        tokenizer_dir: the worker's tokenizer cache (None: the default).
        traced: whether the worker records spans (sent to ``span_sink``).
        kv_channel: ``socket`` (blocks in the socket's payload) or ``shm`` (a shared-memory
            ring of ``shm_bytes``, made at ``start``, unlinked at ``stop`` or once the worker
            is gone: ``ttft.engine.disagg.shm``).

    Raises:
        ValueError: an unknown ``first_token`` or ``kv_channel``; a ring under one block;
            ``config.preemption`` other than ``off``.
    """

    runs_prefill = False  # the prefill worker computes the prompts' K/V

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        config: EngineConfig | None = None,
        *,
        seed: int = 0,
        first_token: str = "decode",
        host: str = "127.0.0.1",
        tokenizer_dir: str | None = None,
        traced: bool = True,
        measure_peaks: bool | None = None,
        kv_channel: str = "socket",
        shm_bytes: int = DEFAULT_RING_BYTES,
    ) -> None:
        if first_token not in FIRST_TOKEN_MODES:
            raise ValueError(f"first_token must be one of {FIRST_TOKEN_MODES}, got {first_token!r}")
        if config is not None and config.preemption != "off":
            raise ValueError("preemption is not supported by the disaggregated engine "
                             "(its decode side receives blocks it cannot recompute)")
        super().__init__(model, tokenizer, config, measure_peaks=measure_peaks)
        check_channel(kv_channel, shm_bytes, self.cache)
        self.first_token, self.kv_channel, self.shm_bytes = first_token, kv_channel, shm_bytes
        self._ring: ShmRing | None = None
        self.span_sink: Callable[[Any], None] | None = None
        worker_config = dataclasses.replace(
            self.config, max_queue=self.config.max_queue + self.config.max_running,
            inject_delay_ms={})
        self.worker = WorkerProcess({
            "model": dataclasses.asdict(model.config), "seed": seed,
            "device": str(next(model.parameters()).device),
            "config": dataclasses.asdict(worker_config), "tokenizer_dir": tokenizer_dir,
            "traced": traced, "clock": f"host:{socket.gethostname()}/prefill",
            "first_token": first_token,
            "measure_peaks": measure_peaks,
        }, host)
        self._inbound: dict[str, Inbound] = {}
        self._inbox_lock = threading.Lock()
        self._keys = iter(range(1 << 62))
        self._failed: BaseException | None = None
        self._receiver: threading.Thread | None = None
        self._closing = False  # stop() was called: the worker's end is expected

    def run_metadata(self) -> dict[str, Any]:
        """``Engine.run_metadata`` plus ``disaggregated``: the first-token mode, the channel
        and the prefill worker's engine metadata."""
        meta = super().run_metadata()
        meta["engine"]["disaggregated"] = {
            "first_token": self.first_token,
            "channel": "shm" if self.kv_channel == "shm" else f"tcp {self.worker.host}",
            "prefill": self.worker.metadata,
        }
        return meta

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout_s: float = 120.0) -> DisaggEngine:  # type: ignore[override]
        """Start the prefill worker (wait for it to be ready), the receiver and the decode
        worker.

        Raises:
            WorkerFailed: the prefill worker did not start.
            RuntimeError: already started.
        """
        if self._receiver is not None:
            raise RuntimeError("engine already started")
        if self.kv_channel == "shm":
            self._ring = ShmRing(self.shm_bytes)
            self.worker.spec["shm"] = self._ring.spec()
        try:
            self.worker.start(timeout_s)
        except BaseException:
            self._close_ring()
            raise
        self._receiver = threading.Thread(target=self._receive, name="ttft-kv-receiver",
                                          daemon=True)
        self._receiver.start()
        return super().start()  # type: ignore[return-value]

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the decode worker, then the prefill worker process (its last spans are
        received first), bounded by ``timeout_s`` each. Idempotent."""
        self._closing = True
        super().stop(timeout_s)
        self.worker.stop(timeout_s)
        if self._receiver is not None:
            self._receiver.join(timeout_s)
        self.worker.kill()
        self._close_ring()

    def _close_ring(self) -> None:
        ring, self._ring = self._ring, None
        if ring is not None:
            ring.close()

    # -- the receiver thread ------------------------------------------------------------

    def _receive(self) -> None:
        sock = self.worker.sock
        assert sock is not None
        for header, payload in self.worker.early:  # spans exported before the worker's ready
            self._on_message(header, payload)
        self.worker.early.clear()
        try:
            while True:
                header, n = recv_header(sock)
                source = blocks_source(self._ring, sock, header, n, self.worker.put)
                if header.get("op") == "blocks":
                    self._on_blocks(source, header)
                else:
                    self._on_message(header, source.payload())
                source.release()
        except (ChannelClosed, OSError):
            pass  # the worker stopped or died: failed below, as after a bad message
        except Exception:  # a malformed message: the channel cannot be trusted any more
            log.exception("ttft disagg: bad message from the prefill worker")
        if not self._closing:
            log.error("ttft disagg: the prefill worker is gone (%s)", self.worker.describe_exit())
        self._close_ring()  # no one writes to it any more
        self._fail_all(EngineStopped(f"the prefill worker is gone ({self.worker.describe_exit()})"))

    def _on_blocks(self, source: Any, header: dict[str, Any]) -> None:
        """A ``blocks`` message: straight into the request's blocks once it has them here
        (``source.install``; under ``_inbox_lock``, see ``_install``), else kept for later
        (``source.payload``: a copy)."""
        first, count = header["first"], header["count"]
        with self._inbox_lock:
            ib = self._inbound.get(header["key"])
            direct = ib is not None and ib.blocks is not None and not ib.parts
            if direct:
                ib.begin_ns = ib.begin_ns or header["begin_ns"]
                source.install(self.cache, ib.blocks[first : first + count],
                               keep_from=max(0, ib.skip - first))
                ib.parts.append((first, count, memoryview(b"")))  # counted, not copied
                self._install(ib)
        if direct:
            self.wake()
        else:
            self._on_message(header, source.payload())

    def _on_message(self, header: dict[str, Any], payload: memoryview) -> None:
        op = header.get("op")
        if op == "spans":
            sink = self.span_sink
            if sink is not None:
                for flat in header["spans"]:
                    sink(rebuild(flat))
            return
        with self._inbox_lock:
            ib = self._inbound.get(header.get("key", ""))
            if ib is None:
                return  # a request given up here: its late messages are dropped
            if op == "blocks":
                ib.begin_ns = ib.begin_ns or header["begin_ns"]
                ib.parts.append((header["first"], header["count"], payload))
                self._install(ib)
            elif op == "token":
                ib.token = (header["token"], header["sampled_ns"], header["cached_tokens"],
                            bytes(payload))
            elif op == "error":
                ib.error = ValueError(header["message"])
        if op == "token" and self.first_token == "prefill":
            self._deliver_first(ib)
        self.wake()

    def _deliver_first(self, ib: Inbound) -> None:
        """The first token to the stream now (``first_token="prefill"``)."""
        token, sampled_ns, cached, _ = ib.token  # type: ignore[misc]
        req = ib.req
        req.sampled_ns = sampled_ns
        reason = finish_reason(token, 1, req.max_tokens, self.tokenizer.eos_id)
        self.deliver(req, (token, reason is not None, reason, cached))

    def _fail_all(self, error: BaseException) -> None:
        with self._inbox_lock:
            self._failed = error
            for ib in self._inbound.values():
                ib.error = ib.error or error
        self.wake()

    # -- the asyncio side ---------------------------------------------------------------

    def queue(self, req: RequestState, ready_ns: int) -> None:
        """Queue ``req`` here (``Engine.queue``) and send it to the prefill worker, with its
        injected delays but ``API_SIDE_DELAYS``; its transfer is registered before it can
        be admitted.

        Raises:
            EngineStopped: the prefill worker is gone.
            QueueFull: as ``Engine.queue``.
        """
        delays, key = req.delays_ms, str(next(self._keys))
        req.delays_ms = {s: ms for s, ms in delays.items() if s in API_SIDE_DELAYS}
        ib = Inbound(req, key, -(-len(req.prompt_ids) // self.cache.block_size))
        with self._inbox_lock:
            if self._failed is not None:
                raise EngineStopped(str(self._failed))
            self._inbound[key] = ib
        try:
            super().queue(req, ready_ns)
        except BaseException:
            with self._inbox_lock:
                self._inbound.pop(key, None)
            raise
        p = req.params
        self.worker.put({
            "op": "prefill", "key": key, "rid": req.rid, "ids": req.prompt_ids,
            "sampling": {"temperature": p.temperature, "top_p": p.top_p, "seed": p.seed},
            "delays": {s: ms for s, ms in delays.items() if s not in API_SIDE_DELAYS},
            "trace": trace_fields(req.parent), "sent_ns": clock_ns(),
        })

    # -- the decode worker thread -------------------------------------------------------

    def on_admit(self, req: RequestState) -> None:
        """An admitted request's prompt blocks, allocated here: from now on the receiver
        installs its blocks as they arrive (the ones that came first, at once). Its wait
        after admission is its transfer, not a batch: no ``batch_wait``."""
        req.scheduled_ns = 0
        seq = req.seq
        assert seq is not None
        self.cache.append(seq, len(req.prompt_ids) - seq.length)
        with self._inbox_lock:
            ib = next((ib for ib in self._inbound.values() if ib.req is req), None)
            if ib is not None:
                ib.blocks, ib.skip = seq.blocks[: ib.total], seq.length // self.cache.block_size
                self._install(ib)

    def on_iteration(self) -> bool:
        """Finish complete transfers, give up failed or cancelled ones; whether any
        request changed."""
        with self._inbox_lock:
            pending = list(self._inbound.values())
        moved = False
        for ib in pending:
            if ib.req.cancelled or ib.error is not None:
                self._give_up(ib)
            elif ib.installed_ns and ib.token is not None:
                self._finish(ib)
                moved = True
        return moved

    def _give_up(self, ib: Inbound) -> None:
        with self._inbox_lock:
            self._inbound.pop(ib.key, None)
            failed = self._failed
        if failed is None:
            self.worker.put({"op": "cancel", "key": ib.key})
        if ib.error is not None and not ib.req.cancelled:  # cancelled: the engine drops it
            self.drop(ib.req, ib.error)

    def _install(self, ib: Inbound) -> None:
        """Write the blocks that arrived into the request's blocks, once it has them
        (called with ``_inbox_lock`` held, by the receiver or the decode worker: a request
        is dropped, and its blocks freed, only after it left ``_inbound`` under that lock,
        so no block is written after another request got it)."""
        if ib.blocks is None:
            return
        for first, count, payload in ib.parts:
            if payload.nbytes:  # kept until now (else received in place by _on_blocks)
                install_blocks(self.cache, ib.blocks[first : first + count], payload,
                               keep_from=max(0, ib.skip - first))
            ib.installed += count
            ib.nbytes += count * block_bytes(self.cache)
        if ib.parts and ib.installed >= ib.total:
            ib.installed_ns = clock_ns()
        ib.parts = []

    def _finish(self, ib: Inbound) -> None:
        """The transfer is complete: record it, then the request decodes."""
        with self._inbox_lock:
            self._inbound.pop(ib.key, None)
        req, n_prompt = ib.req, len(ib.req.prompt_ids)
        assert req.seq is not None and ib.token is not None
        record("kv_transfer", ib.begin_ns, ib.installed_ns, request_id=req.rid,
               parent=req.parent, **{ATTR_KV_BLOCKS: ib.total, ATTR_KV_BYTES: ib.nbytes,
                                     ATTR_KV_FIRST_TOKEN: self.first_token})
        token, sampled_ns, cached, state = ib.token
        req.seq.length = req.computed = n_prompt
        req.cached_tokens, req.sampled_ns = cached, sampled_ns
        if state and req.generator is not None:
            req.generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
        if self.first_token == "decode":
            self.emit(req, token)
            return
        req.out_ids.append(token)
        if finish_reason(token, 1, req.max_tokens, self.tokenizer.eos_id) is not None:
            self.prefix_cache.insert(req.prompt_ids + req.out_ids, req.seq)
            self.drop(req)

    def on_drop(self, req: RequestState, error: BaseException | None) -> None:
        """Forget ``req``'s transfer (under ``_inbox_lock``, so the receiver writes no more
        of its blocks) and cancel it at the prefill worker, before the engine frees them."""
        with self._inbox_lock:
            gone = [k for k, ib in self._inbound.items() if ib.req is req]
            for key in gone:
                del self._inbound[key]
            failed = self._failed
        for key in gone if failed is None else ():
            self.worker.put({"op": "cancel", "key": key})

