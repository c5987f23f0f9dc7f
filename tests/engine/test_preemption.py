"""Recompute preemption in the engine, on the tiny model with a K/V pool too small for its
requests: off by default (requests wait for room instead); with it on, the request
admitted last is preempted when a decoding request needs a block, its output still equals
plain greedy decoding, and its ``preempted`` span, from the preemption to its admission
again, names who needed the blocks and lies inside its TTFT when it was still prefilling,
after it when it had its first token."""

from __future__ import annotations

import asyncio
from itertools import pairwise

import pytest

import ttft.tracer as tt
from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.analysis.blame import blame
from ttft.analysis.preemption import preemptions
from ttft.collectors import read_spans
from ttft.collectors.otel_exporter import ParquetSpanExporter
from ttft.engine import Engine, EngineConfig
from ttft.engine.kv_cache import PagedKVCache
from ttft.engine.model import greedy

# 8-position blocks; budget for every chunk and decode token of these requests at once
POOL = dict(max_batch_tokens=64, block_size=8)




def reference(model, tok, ids: list[int], max_tokens: int) -> list[int]:
    """Plain greedy decoding, cut after EOS as the engine cuts it."""
    out = greedy(model, PagedKVCache.for_model(model, 128, 8), ids, max_tokens)
    return out[: out.index(tok.eos_id) + 1] if tok.eos_id in out else out


def run(model, tok, requests: dict[str, tuple[list[int], int]], **config):
    """Submit ``requests`` (id → (prompt ids, max_tokens)) so that one step admits them
    all: a one-token ``gate`` request holds the worker in its admission (an injected
    ``schedule`` delay) while they are queued. Returns (engine, tokens per id)."""
    engine = Engine(model, tok, EngineConfig(**{**POOL, **config})).start()

    async def main():
        gate = await engine.submit([1], 1, request_id="gate", inject_delay_ms={"schedule": 300})
        while gate.admitted_ns is None:  # the worker now sleeps in the gate's schedule
            await asyncio.sleep(0.001)
        streams = {rid: await engine.submit(ids, n, request_id=rid)
                   for rid, (ids, n) in requests.items()}
        outs = await asyncio.gather(*(_drain(s) for s in [gate, *streams.values()]))
        return dict(zip(streams, outs[1:], strict=True))

    try:
        return engine, asyncio.run(main())
    finally:
        engine.stop()


async def _drain(stream) -> list[int]:
    return [event.token_id async for event in stream]


def spans_of(exporter, rid: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in sorted(exporter.spans, key=lambda s: s.start_time):
        if s.attributes.get("ttft.request_id") == rid:
            out.setdefault(s.name, []).append(s)
    return out


def test_preemption_is_off_by_default_and_requests_wait_for_room(model, tok):
    assert EngineConfig().preemption == "off"
    requests = {"a": (tok.ids_of_length(16, seed=1), 10), "b": (tok.ids_of_length(15, seed=2), 10)}
    # each needs 4 blocks for prompt + max_tokens; 5 blocks hold one at a time
    engine, outs = run(model, tok, requests, num_blocks=5)
    assert engine.preemptions == 0
    for rid, (ids, n) in requests.items():
        assert outs[rid] == reference(model, tok, ids, n), rid


def test_config_refuses_an_unknown_preemption_mode():
    with pytest.raises(ValueError, match="preemption must be one of off, recompute, got 'swap'"):
        EngineConfig(preemption="swap")


def test_a_decoding_request_preempted_for_another_recomputes_the_same_output(model, tok, collect):
    # a (16 tokens) and b (15) fill 4 blocks; a's first decode writes position 16, in a
    # third block of its own: b, admitted last, is preempted after its first token.
    exporter, tracing = collect
    requests = {"a": (tok.ids_of_length(16, seed=3), 10), "b": (tok.ids_of_length(15, seed=4), 10)}
    engine, outs = run(model, tok, requests, num_blocks=4, preemption="recompute")
    tracing.flush()
    for rid, (ids, n) in requests.items():
        assert outs[rid] == reference(model, tok, ids, n), rid
    assert engine.preemptions == 1
    b = spans_of(exporter, "b")
    (pre,) = b["preempted"]
    said = {k: v for k, v in pre.attributes.items() if not k.startswith("ttft.")}
    steps = {s.attributes["step_id"]: s for s in exporter.spans if s.name == "step"}
    preempting = [i for i, s in steps.items() if "preempted_request_ids" in s.attributes]
    assert said == {"preempted_by": ("a",), "step_id": preempting[0], "blocks_freed": 2,
                    "generated_tokens": 1}
    assert preempting == [steps[preempting[0]].attributes["step_id"]]
    assert tuple(steps[preempting[0]].attributes["preempted_request_ids"]) == ("b",)
    assert pre.start_time <= steps[preempting[0]].start_time  # before the step that needed it
    assert pre.start_time >= b["first_sampled"][0].start_time  # after its TTFT
    # admitted again: schedule, batch_wait and the recompute's prefill follow, tiled
    resumed = b["schedule"][1]
    assert resumed.start_time == pre.end_time
    assert dict(resumed.attributes)["recompute_tokens"] == 16  # prompt + 1 generated
    assert b["batch_wait"][1].start_time == resumed.end_time
    recompute = b["prefill"][1]
    assert recompute.attributes["recompute"] is True
    assert sum(c.attributes["chunk_tokens"] for c in b["prefill.chunk"][1:]) == 16
    assert len(b["sample"]) == len(b["first_sampled"]) == 1  # one first token
    assert "a" not in {s.attributes.get("ttft.request_id") for s in exporter.spans
                       if s.name == "preempted"}


def test_a_request_preempted_while_prefilling_has_the_wait_inside_its_ttft(
    model, tok, tmp_path
):
    # a (15 tokens) and b (64, in chunks of 8) fill 10 blocks at admission; a's decode of
    # position 16 needs an 11th while b is still prefilling: b is preempted, waits until a
    # ends, then recomputes its whole prompt.
    trace = tmp_path / "t.parquet"
    tracing = tt.configure("engine", [ParquetSpanExporter(trace)], flush_interval_s=0.02)
    requests = {"a": (tok.ids_of_length(15, seed=5), 12), "b": (tok.ids_of_length(64, seed=6), 4)}
    try:
        engine, outs = run(model, tok, requests, num_blocks=10, chunk_size=8,
                           preemption="recompute")
    finally:
        tracing.shutdown()
    for rid, (ids, n) in requests.items():
        assert outs[rid] == reference(model, tok, ids, n), rid
    assert engine.preemptions == 1
    asm = assemble(read_spans(trace))
    (pre,) = preemptions(asm).to_dict("records")
    assert (pre["request_id"], pre["preempted_by"], pre["generated_tokens"]) == ("b", ("a",), 0)
    assert (pre["ran"], pre["blocks_freed"]) == (("a",), 3) and pre["preempted_ns"] > 0
    # the engine boundary's window of b holds the wait; of a, nothing preempted
    attr = attribute(asm, boundary="engine", policy="exclusive")
    by_rid = dict(zip(attr.requests["request_id"], attr.attributed["preempted"], strict=True))
    assert by_rid["a"] == 0 and by_rid["b"] == pre["preempted_ns"]
    # blame: b's preempted time is a's decode (steps) and the gaps between steps
    rows = blame(asm).set_index(["request_id", "wait"])
    wait = rows.loc[("b", "preempted")]
    assert wait["wait_ns"] == pre["preempted_ns"]
    assert wait["decode_ns"] > wait["idle_ns"] and wait["prefill_ns"] == 0
    # the preemption is no gap between b's chunks (it would hold the whole wait)
    assert rows.loc[("b", "between_chunks")]["wait_ns"] < pre["preempted_ns"]


def test_preempted_spans_tile_a_prefilling_request_up_to_its_first_token(model, tok, collect):
    exporter, tracing = collect
    requests = {"a": (tok.ids_of_length(15, seed=5), 12), "b": (tok.ids_of_length(64, seed=6), 4)}
    run(model, tok, requests, num_blocks=10, chunk_size=8, preemption="recompute")
    tracing.flush()
    b = spans_of(exporter, "b")
    cut, recompute = b["prefill"]
    assert cut.attributes["preempted"] is True and "recompute" not in cut.attributes
    assert recompute.attributes["recompute"] is True
    (pre,) = b["preempted"]
    chunks = b["prefill.chunk"]
    first = [c for c in chunks if c.end_time <= cut.end_time]
    again = [c for c in chunks if c.start_time >= recompute.start_time]
    assert len(first) + len(again) == len(chunks)
    assert sum(c.attributes["chunk_tokens"] for c in again) == 64  # the whole prompt again
    assert all(c.attributes["recompute"] is True for c in again)
    # tokenize → queue → schedule → batch_wait → prefill (cut) → preempted → schedule →
    # batch_wait → prefill (recompute) → sample → first_sampled, without a gap
    chain = [b["tokenize"][0], b["queue"][0], b["schedule"][0], b["batch_wait"][0], cut, pre,
             b["schedule"][1], b["batch_wait"][1], recompute, b["sample"][0]]
    assert [x.end_time - y.start_time for x, y in pairwise(chain)] == [0] * (len(chain) - 1)
    assert (cut.start_time, recompute.start_time) == (first[0].start_time, again[0].start_time)
    assert recompute.end_time == again[-1].end_time
    assert b["first_sampled"][0].start_time == b["sample"][0].end_time
