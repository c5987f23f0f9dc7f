"""The prefill worker process: ``python -m ttft.engine.disagg.worker SPEC`` (``SPEC`` a JSON
object, written by ``ttft.engine.disagg.process``).

It connects to the decode side at ``SPEC["port"]`` on ``SPEC["host"]``, builds the same
model (same config, seed and device, so the same weights) under a ``PrefillEngine``,
answers ``ready`` with its run metadata, then serves ``prefill``, ``cancel`` and (with a
shared-memory ring, ``SPEC["shm"]``) ``free`` messages until ``stop`` or until the
connection ends (the decode side went away: it exits then too, so it never outlives its
server). With ``SPEC["traced"]`` its spans are recorded in
its own clock domain (``SPEC["clock"]``) as service ``ttft-prefill`` and go back over the
channel; on ``stop`` they are flushed before the final ``bye``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

from ttft.engine.config import EngineConfig
from ttft.engine.disagg.channel import ChannelClosed, Outbox, recv
from ttft.engine.disagg.prefill import PrefillEngine
from ttft.engine.disagg.process import TOKEN_ENV
from ttft.engine.disagg.span_wire import ChannelExporter
from ttft.engine.model import ModelConfig, Transformer
from ttft.engine.tokenizer import Tokenizer

__all__ = ["PREFILL_SERVICE", "build", "main", "serve_control"]

PREFILL_SERVICE = "ttft-prefill"
"""``service.name`` of the prefill worker's spans."""


def build(spec: dict[str, Any], outbox: Outbox) -> PrefillEngine:
    """The worker's (not started) engine for ``spec``."""
    config = ModelConfig(**spec["model"])
    model = Transformer.from_config(config, seed=spec["seed"], device=spec["device"])
    tokenizer = Tokenizer.load(vocab_size=config.vocab_size, cache_dir=spec.get("tokenizer_dir"))
    engine_config = EngineConfig(**spec["config"])
    return PrefillEngine(model, tokenizer, engine_config, outbox=outbox,
                         first_token=spec.get("first_token", "decode"),
                         ring_spec=spec.get("shm"),
                         measure_peaks=spec.get("measure_peaks"))


def serve_control(sock: socket.socket, engine: PrefillEngine) -> None:
    """Serve the decode side's messages until ``stop`` or the end of the connection."""
    while True:
        try:
            header, _ = recv(sock)
        except (ChannelClosed, OSError):
            return
        op = header.get("op")
        if op == "prefill":
            engine.enqueue(header)
        elif op == "cancel":
            engine.cancel(header["key"])
        elif op == "free" and engine.ring is not None:
            engine.ring.release(*header["shm"])
        elif op == "stop":
            return


def main(argv: list[str] | None = None) -> int:
    """Run the worker until told to stop; 0 on a clean stop."""
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    sock = socket.create_connection((spec["host"], spec["port"]), timeout=30)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    outbox = Outbox(sock, "ttft-prefill-outbox")
    outbox.put({"op": "hello", "token": os.environ.pop(TOKEN_ENV, "")})
    tracing = None
    if spec.get("traced"):
        from ttft.tracer import configure

        tracing = configure(PREFILL_SERVICE, [ChannelExporter(outbox)], clock=spec["clock"])
    engine = build(spec, outbox)
    try:
        engine.start()
        outbox.put({"op": "ready", "metadata": engine.run_metadata()["engine"]})
        serve_control(sock, engine)
    finally:
        if engine.ring is not None:
            engine.ring.close()  # a send waiting for space gives up
        engine.stop()
        if tracing is not None:
            tracing.shutdown()
        outbox.put({"op": "bye"})
        outbox.close()
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
