"""``ttft demo``: the whole loop on one machine, in-process.

Starts the reference server on a free loopback port, sends it a mixed Poisson workload
with the load generator (varied prompt lengths, a few shared prefixes so some requests
hit the prefix cache), writes the client's and the server's spans into one Parquet trace,
and returns the analysis of that trace.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.analysis.summary import summarize
from ttft.collectors import loadgen, workloads
from ttft.collectors.otel_exporter import ParquetSpanExporter
from ttft.collectors.store import TraceWriter, read_trace
from ttft.tracer import configure


@dataclass(frozen=True)
class DemoResult:
    """Where the trace went, what the analysis says, and how the requests fared."""

    trace: Path
    summary: dict[str, Any]
    requests: int
    errors: int
    seconds: float


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prompts(n: int, seed: int, words: list[str], max_words: int) -> list[str]:
    """``n`` prompts of varied length up to ``max_words`` words; every third one starts
    with one of four shared prefixes (prefix-cache hits)."""
    rnd = random.Random(seed)
    prefix_words = max_words * 3 // 10
    prefixes = [" ".join(rnd.choices(words, k=prefix_words)) for _ in range(4)]
    out = []
    for i in range(n):
        body = " ".join(rnd.choices(words, k=rnd.randint(10, max_words - prefix_words)))
        out.append(f"{prefixes[i % 4]} {body}" if i % 3 == 0 else body)
    return out


def run_demo(
    out_dir: Path,
    *,
    requests: int = 200,
    model: str = "small",
    rate_per_s: float = 6.0,
    max_tokens: int = 16,
    seed: int = 0,
) -> DemoResult:
    """Serve ``model`` on CPU in-process, trace ``requests`` Poisson arrivals, analyze.

    Raises:
        OSError: ``out_dir`` cannot be written.
    """
    import uvicorn

    from ttft.engine.server import build_engine, create_app
    from ttft.engine.tokenizer import corpus_text

    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = out_dir / "demo.parquet"
    engine = build_engine(model, device="cpu", seed=seed)
    writer = TraceWriter(
        trace,
        metadata={
            "workload": {
                "command": "ttft demo",
                "requests": requests,
                "rate_per_s": rate_per_s,
                "max_tokens": max_tokens,
                "seed": seed,
                "arrivals": "poisson",
            },
            **engine.run_metadata(),
        },
    )
    tracing = configure("ttft-demo-server", [ParquetSpanExporter(writer)])
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(engine, model_name=model),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="on",
        )
    )
    thread = threading.Thread(target=server.run, name="ttft-demo-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the demo server did not start")
            time.sleep(0.05)
        words = corpus_text().split()
        # about 1.3 tokens a word: keep prompt + output well inside the context
        max_words = min(300, (engine.model.config.max_seq_len - max_tokens) // 2)
        work = workloads.workload(
            workloads.poisson(rate_per_s, requests, seed),
            _prompts(requests, seed, words, max_words),
            max_tokens,
        )
        results = asyncio.run(
            loadgen.run(
                f"http://127.0.0.1:{port}",
                work,
                model=model,
                warmup=1,
                writer=writer,
                timeout_s=120,
            )
        )
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        tracing.shutdown()  # flushes the server's spans and closes the writer
    table = read_trace(trace)
    asm = assemble(table)
    summary = summarize(attribute(asm), asm, trace=str(trace))
    errors = sum(1 for r in results if r.error)
    return DemoResult(trace, summary, len(results), errors, time.perf_counter() - started)
