"""``ttft validate``'s preemption case: a K/V pool too small for its requests, recompute
preemption on, and the ``preempted`` stage checked end to end.

The reference engine serves ``REQUESTS`` requests sent at once, each a distinct
``PROMPT_TOKENS``-token prompt (whole 16-position blocks) and ``MAX_TOKENS`` to generate,
over a pool of exactly their prompts' blocks (``EngineConfig.preemption="recompute"``,
chunks of ``CHUNK_TOKENS`` in steps of ``STEP_TOKENS``, so the prompts are prefilled a few
at a time). The first request to finish its prefill needs a block for its first decode
token and none is free: the request admitted last, still prefilling, is preempted, and
waits, inside its TTFT, until finishing requests give blocks back. The trace is attributed
at the server boundary (exclusive), as the delay phases are.

The case passes when every request succeeded, at least one was preempted before its first
token, and each of those has ``preempted`` time attributed in its TTFT (> 0), blame splits
that wait into other requests' prefill and decode (> 0 of it), and it names the requests
that took the blocks, none of them the request itself (``analysis.preemption``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ttft.analysis.blame import blame
from ttft.analysis.pipeline import analyze
from ttft.analysis.preemption import preemptions
from ttft.collectors import TraceWriter, loadgen, read_spans, workloads
from ttft.collectors.otel_exporter import ParquetSpanExporter
from ttft.tracer import configure
from ttft.tracer.schema import OUTCOME_OK

__all__ = ["PreemptedRequest", "PreemptionCheck", "run_preemption_case"]

REQUESTS = 6
PROMPT_TOKENS = 192
MAX_TOKENS = 32
BLOCK_SIZE = 16
CHUNK_TOKENS = 16
STEP_TOKENS = 32
BOUNDARY = "server"
POLICY = "exclusive"
_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class PreemptedRequest:
    """One request preempted before its first token.

    Attributes:
        request_id: the server's id of the request.
        preempted_ms: its ``preempted`` time attributed in its TTFT (server boundary).
        blamed_ms: the part of its ``preempted`` wait blame gives to other requests'
            prefill and decode (the rest: between steps).
        taken_by: the requests whose next blocks its blocks went to (``preempted_by``).
        ran: the requests the engine's steps served while it waited.
    """

    request_id: str
    preempted_ms: float
    blamed_ms: float
    taken_by: tuple[str, ...]
    ran: tuple[str, ...]

    @property
    def ok(self) -> bool:
        named = bool(self.taken_by) and self.request_id not in self.taken_by
        return self.preempted_ms > 0 and self.blamed_ms > 0 and named


@dataclass(frozen=True)
class PreemptionCheck:
    """The verdict of the preemption case.

    Attributes:
        trace: the case's trace file.
        num_blocks: the K/V pool's blocks.
        requests, errors: requests sent and those that failed.
        preemptions: ``preempted`` spans in the trace (before or after a first token).
        before_first_token: the requests preempted before their first token, checked.
    """

    trace: Path
    num_blocks: int
    requests: int
    errors: int
    preemptions: int
    before_first_token: list[PreemptedRequest]

    @property
    def ok(self) -> bool:
        checked = self.before_first_token
        return not self.errors and bool(checked) and all(p.ok for p in checked)


def run_preemption_case(out_dir: Path, *, model: str, device: str, seed: int) -> PreemptionCheck:
    """Serve the case's engine in process, send its requests at once, check the trace
    (module docstring); the trace is ``out_dir / "preemption.parquet"``."""
    from ttft.engine import Engine, EngineConfig, Tokenizer, Transformer
    from ttft.engine.model import ModelConfig
    from ttft.engine.server import serving

    config = ModelConfig.preset(model)
    net = Transformer.from_config(config, seed=seed, device=device)
    tokenizer = Tokenizer.load(vocab_size=config.vocab_size)
    num_blocks = REQUESTS * PROMPT_TOKENS // BLOCK_SIZE
    engine = Engine(net, tokenizer, EngineConfig(
        max_batch_tokens=STEP_TOKENS, chunk_size=CHUNK_TOKENS, num_blocks=num_blocks,
        block_size=BLOCK_SIZE, max_running=REQUESTS, preemption="recompute"))
    prompts = [tokenizer.ids_of_length(PROMPT_TOKENS, seed=seed * 1000 + i)
               for i in range(REQUESTS)]
    items = workloads.workload(workloads.burst(REQUESTS), prompts, MAX_TOKENS)
    trace = out_dir / "preemption.parquet"
    writer = TraceWriter(trace, metadata={
        "workload": {"command": "ttft validate", "phase": "preemption", "requests": REQUESTS,
                     "prompt_tokens": PROMPT_TOKENS, "max_tokens": MAX_TOKENS,
                     "concurrency": REQUESTS, "seed": seed},
        **engine.run_metadata()})
    tracing = configure("ttft-validate-preemption", [ParquetSpanExporter(writer)])
    model_name = f"ttft-{model}"
    try:
        with serving(engine, model_name=model_name) as base_url:
            results = asyncio.run(loadgen.run(base_url, items, model=model_name,
                                              concurrency=REQUESTS, writer=writer,
                                              timeout_s=_TIMEOUT_S))
    finally:
        tracing.shutdown()  # flushes the server's spans and closes the writer
    errors = sum(1 for r in results if r.outcome != OUTCOME_OK)
    return _check(trace, num_blocks, len(results), errors)


def _check(trace: Path, num_blocks: int, requests: int, errors: int) -> PreemptionCheck:
    analysis = analyze(read_spans(trace), boundary=BOUNDARY, policy=POLICY)
    asm, attribution = analysis.assembly, analysis.attribution
    found = preemptions(asm)
    attributed = dict(zip(attribution.requests["request_id"],
                          attribution.attributed["preempted"].to_numpy() / 1e6, strict=True))
    waits = blame(asm)
    waits = waits[waits["wait"] == "preempted"]
    blamed = dict(zip(waits["request_id"],
                      (waits["prefill_ns"] + waits["decode_ns"]).to_numpy() / 1e6, strict=True))
    early = found[found["generated_tokens"] == 0]
    checked = []
    for rid, group in early.groupby("request_id", sort=True):
        taken_by = tuple(dict.fromkeys(by for row in group["preempted_by"] for by in row))
        ran = tuple(sorted({r for row in group["ran"] for r in row}))
        checked.append(PreemptedRequest(str(rid), float(attributed.get(rid, np.nan)),
                                        float(blamed.get(rid, 0.0)), taken_by, ran))
    return PreemptionCheck(trace, num_blocks, requests, errors, len(found), checked)
