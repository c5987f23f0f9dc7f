"""The continuous-batching engine on the tiny model: batched, chunked greedy output equals
plain greedy decoding; chunks of a long prompt share steps with another request's decode;
the request-level and engine-level spans land where docs/design.md says; prefix hits,
cancellation, a full queue, stopping and injected delays behave as documented; and one
request's numerical failure (its sampling row) fails that request alone."""

from __future__ import annotations

import asyncio
import json
import time
from itertools import pairwise

import pytest
from _live import Collect

import ttft.tracer as tt
from ttft.engine import Engine, EngineConfig, EngineStopped, QueueFull, SamplingParams
from ttft.engine.kv_cache import PagedKVCache
from ttft.engine.model import Transformer, greedy
from ttft.engine.sampler import SamplingError
from ttft.engine.tokenizer import Tokenizer

SMALL = dict(max_batch_tokens=40, chunk_size=16, block_size=8, num_blocks=512)




def reference(model: Transformer, tok: Tokenizer, ids: list[int], max_tokens: int) -> list[int]:
    """Plain greedy decoding, cut after EOS as the engine cuts it."""
    out = greedy(model, PagedKVCache.for_model(model, 128, 8), ids, max_tokens)
    return out[: out.index(tok.eos_id) + 1] if tok.eos_id in out else out


def serve(model, tok, main, **config):
    """Run ``main(engine)`` under ``asyncio.run`` with a started engine; stop it after."""
    engine = Engine(model, tok, EngineConfig(**{**SMALL, **config})).start()
    try:
        return asyncio.run(main(engine))
    finally:
        engine.stop()


async def drain(stream) -> list:
    return [event async for event in stream]


async def tokens_of(engine: Engine, ids, max_tokens: int, **kw) -> list:
    return await drain(await engine.submit(ids, max_tokens, **kw))


def request_spans(exporter: Collect, rid: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in exporter.spans:
        if s.attributes.get("ttft.request_id") == rid:
            out.setdefault(s.name, []).append(s)
    return out


def test_single_request_equals_greedy(model, tok):
    ids = tok.ids_of_length(40, seed=1)

    async def main(engine):
        return await tokens_of(engine, ids, 12)

    events = serve(model, tok, main)
    assert [e.token_id for e in events] == reference(model, tok, ids, 12)
    assert events[-1].finished and not any(e.finished for e in events[:-1])
    assert events[-1].finish_reason in ("length", "stop")
    usage = events[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (
        40,
        len(events),
        0,
    )
    assert "".join(e.text for e in events) == tok.decode([e.token_id for e in events])


def test_concurrent_requests_of_different_lengths_each_equal_greedy(model, tok):
    cases = [(tok.ids_of_length(n, seed=n), m) for n, m in ((5, 10), (37, 7), (70, 12), (120, 5))]

    async def main(engine):
        return await asyncio.gather(*(tokens_of(engine, ids, m) for ids, m in cases))

    results = serve(model, tok, main)
    for (ids, m), events in zip(cases, results, strict=True):
        assert [e.token_id for e in events] == reference(model, tok, ids, m)


def test_long_prompt_is_chunked_across_steps_that_also_decode(model, tok, collect):
    exporter, tracing = collect
    short, long = tok.ids_of_length(6, seed=2), tok.ids_of_length(150, seed=3)

    async def main(engine):
        # Submitted back to back: "long" is admitted at most one step after "short", whose
        # 40 decode steps outlast the 10 chunks of "long".
        a = await engine.submit(short, 40, request_id="short")
        b = await engine.submit(long, 4, request_id="long")
        return await asyncio.gather(drain(a), drain(b))

    short_events, long_events = serve(model, tok, main)
    tracing.flush()
    assert [e.token_id for e in short_events] == reference(model, tok, short, 40)
    assert [e.token_id for e in long_events] == reference(model, tok, long, 4)
    chunks = request_spans(exporter, "long")["prefill.chunk"]
    assert sorted(c.attributes["chunk_tokens"] for c in chunks) == [6] + [16] * 9
    steps = {s.attributes["step_id"]: s for s in exporter.spans if s.name == "step"}
    mixed = [
        steps[c.attributes["step_id"]]
        for c in chunks
        if steps[c.attributes["step_id"]].attributes["decode_tokens"] > 0
    ]
    assert len(mixed) >= 2  # several chunks of "long" ran in steps that decoded "short"
    for step in mixed:
        assert step.attributes["prefill_tokens"] > 0
        assert set(step.attributes["request_ids"]) == {"short", "long"}


def test_trace_has_request_stages_and_linked_step_spans(model, tok, collect):
    exporter, tracing = collect
    ids = tok.ids_of_length(40, seed=4)

    async def main(engine):
        with tt.request_context(None, "r1") as root:
            events = await tokens_of(engine, ids, 5, request_id="r1")
        return root, events

    root, events = serve(model, tok, main)
    tracing.flush()
    spans = request_spans(exporter, "r1")
    for name in ("tokenize", "queue", "schedule", "prefill", "sample", "detokenize"):
        assert len(spans[name]) == 1, name
        assert spans[name][0].context.trace_id == root.trace_id
        assert spans[name][0].parent is None  # the fresh trace's root has no span
    prefill, sample = spans["prefill"][0], spans["sample"][0]
    chunks = spans["prefill.chunk"]
    assert [c.attributes["chunk_tokens"] for c in chunks] == [16, 16, 8]
    assert [c.attributes["context_tokens"] for c in chunks] == [16, 32, 40]
    assert all(c.attributes["cached_tokens"] == 0 for c in chunks)
    assert all(c.parent.span_id == prefill.context.span_id for c in chunks)
    assert prefill.start_time == chunks[0].start_time and prefill.end_time == chunks[-1].end_time
    (first,) = spans["first_sampled"]
    assert first.parent.span_id == sample.context.span_id
    assert first.attributes["ttft.stage"] == "event" and first.start_time == first.end_time
    assert sample.attributes["token_id"] == events[0].token_id
    order = ["tokenize", "queue", "schedule", "prefill", "sample", "detokenize"]
    starts = [spans[n][0].start_time for n in order]
    assert starts == sorted(starts)

    steps = {s.attributes["step_id"]: s for s in exporter.spans if s.name == "step"}
    queue_span_id = spans["queue"][0].context.span_id
    for c in chunks:
        step = steps[c.attributes["step_id"]]
        assert step.context.trace_id != root.trace_id and step.parent is None
        assert step.attributes["prefill_tokens"] == c.attributes["chunk_tokens"]
        assert list(step.attributes["request_ids"]) == ["r1"]
        assert [(link.context.span_id, link.attributes["request_id"]) for link in step.links] == [
            (queue_span_id, "r1")
        ]
    forwards = [s for s in exporter.spans if s.name == "forward"]
    assert len(forwards) == len(steps) == 3 + 4  # 3 chunks, then 4 decode steps
    for f in forwards:
        assert f.parent.span_id == steps[f.attributes["step_id"]].context.span_id


def test_a_request_s_spans_meet_up_to_its_first_token(model, tok, collect):
    # Two requests at once, three chunks each of at most 16 tokens in 40-token steps: each
    # request's spans tile tokenize start -> first_sampled, the batch_wait running from
    # the end of its schedule to its first chunk (in the step its step_id names).
    exporter, tracing = collect
    prompts = {"a": tok.ids_of_length(40, seed=6), "b": tok.ids_of_length(36, seed=7)}

    async def main(engine):
        streams = [await engine.submit(ids, 3, request_id=rid) for rid, ids in prompts.items()]
        return await asyncio.gather(*(drain(s) for s in streams))

    serve(model, tok, main)
    tracing.flush()
    for rid in prompts:
        spans = request_spans(exporter, rid)
        one = {name: found[0] for name, found in spans.items()}
        chunks = sorted(spans["prefill.chunk"], key=lambda c: c.start_time)
        chain = [one["tokenize"], one["queue"], one["schedule"], one["batch_wait"], chunks[0]]
        chain_ends = [chunks[-1], one["sample"], one["deliver"], one["detokenize"]]
        for part in (chain, chain_ends):
            assert [a.end_time - b.start_time for a, b in pairwise(part)] == [0] * (
                len(part) - 1
            ), rid
        assert one["first_sampled"].start_time == one["sample"].end_time
        assert one["batch_wait"].attributes["step_id"] == chunks[0].attributes["step_id"]
        assert one["deliver"].attributes["leg"] == "to_loop"


def test_shared_prefix_hits_the_cache_and_gives_the_same_output(model, tok):
    ids = tok.ids_of_length(50, seed=5)

    async def main(engine):
        cold = await tokens_of(engine, ids, 6)
        warm = await tokens_of(engine, ids, 6)
        extended = await tokens_of(engine, ids[:40] + tok.ids_of_length(9, seed=6), 6)
        return cold, warm, extended

    cold, warm, extended = serve(model, tok, main)
    assert cold[-1].usage.cached_tokens == 0
    assert warm[-1].usage.cached_tokens == 48  # full blocks of 8, one token left to compute
    assert extended[-1].usage.cached_tokens == 40
    assert [e.token_id for e in warm] == [e.token_id for e in cold]
    ext_ids = ids[:40] + tok.ids_of_length(9, seed=6)
    assert [e.token_id for e in extended] == reference(model, tok, ext_ids, 6)


def test_cancel_frees_blocks_and_drops_waiting_requests(model, tok):
    ids = tok.ids_of_length(30, seed=7)

    async def wait_for(cond, timeout_s=2.0):
        deadline = time.monotonic() + timeout_s
        while not cond() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return cond()

    async def main(engine):
        stream = await engine.submit(ids, 400)
        await stream.__anext__()
        await stream.__anext__()
        assert engine.cache.blocks_in_use() > 0
        await stream.aclose()
        freed = await wait_for(lambda: engine.cache.blocks_in_use() == 0 and not engine.num_running)
        # A consumer task cancelled while the request still waits (queue delay) drops it.
        held = await engine.submit(ids, 5, inject_delay_ms={"queue": 10_000})
        task = asyncio.ensure_future(held.__anext__())
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        dropped = await wait_for(lambda: engine.num_waiting == 0)
        return freed, dropped

    assert serve(model, tok, main) == (True, True)


def test_queue_full_and_bounded_stop(model, tok):
    engine = Engine(model, tok, EngineConfig(**SMALL, max_queue=2)).start()
    ids = tok.ids_of_length(10, seed=8)

    async def main():
        held = {"queue": 10_000}
        streams = [await engine.submit(ids, 5, inject_delay_ms=held) for _ in range(2)]
        with pytest.raises(QueueFull, match="waiting queue full"):
            await engine.submit(ids, 5)
        t0 = time.monotonic()
        await asyncio.to_thread(engine.stop, 2.0)
        stop_s = time.monotonic() - t0
        for stream in streams:
            with pytest.raises(EngineStopped):
                await stream.__anext__()
        with pytest.raises(EngineStopped):
            await engine.submit(ids, 5)
        return stop_s

    stop_s = asyncio.run(main())
    assert stop_s < 1.0


def test_stop_while_decoding_is_bounded(model, tok):
    engine = Engine(model, tok, EngineConfig(**SMALL)).start()

    async def main():
        stream = await engine.submit(tok.ids_of_length(10, seed=9), 400)
        await stream.__anext__()
        t0 = time.monotonic()
        await asyncio.to_thread(engine.stop, 2.0)
        stop_s = time.monotonic() - t0
        with pytest.raises(EngineStopped):
            async for _ in stream:
                pass
        return stop_s

    assert asyncio.run(main()) < 1.0
    assert engine.cache.blocks_in_use() == 0


def test_injected_queue_delay_holds_back_only_that_request(model, tok, collect):
    exporter, tracing = collect
    ids = tok.ids_of_length(12, seed=10)

    async def main(engine):
        return await asyncio.gather(
            tokens_of(engine, ids, 3, request_id="slow", inject_delay_ms={"queue": 50}),
            tokens_of(engine, ids, 3, request_id="fast"),
        )

    slow, fast = serve(model, tok, main, inject_delay_ms={"tokenize": 20})
    tracing.flush()
    assert [e.token_id for e in slow] == [e.token_id for e in fast]

    def dur_ms(rid, name):
        (span,) = request_spans(exporter, rid)[name]
        return (span.end_time - span.start_time) / 1e6

    assert dur_ms("slow", "queue") >= 50
    assert dur_ms("fast", "queue") < 50
    assert dur_ms("slow", "tokenize") >= 20 and dur_ms("fast", "tokenize") >= 20
    first = {
        rid: request_spans(exporter, rid)["first_sampled"][0].start_time for rid in ("slow", "fast")
    }
    assert first["fast"] < first["slow"]


def test_config_and_submit_reject_bad_values(model, tok):
    with pytest.raises(ValueError, match="max_running"):
        EngineConfig(max_running=0)
    with pytest.raises(ValueError, match="unknown stage"):
        EngineConfig(inject_delay_ms={"prefill": 1.0})

    async def main(engine):
        with pytest.raises(ValueError, match="empty prompt"):
            await engine.submit([], 3)
        with pytest.raises(ValueError, match="max_seq_len"):
            await engine.submit([1] * 500, 100)

    serve(model, tok, main)


def test_run_metadata_names_device_dtype_and_configs(model, tok):
    engine = Engine(model, tok, EngineConfig(max_batch_tokens=64))
    meta = engine.run_metadata()["engine"]
    assert (meta["device"], meta["dtype"], meta["device_name"]) == ("cpu", "float32", "cpu")
    assert meta["model"]["n_layer"] == model.config.n_layer
    assert meta["config"]["max_batch_tokens"] == 64
    json.dumps(meta)  # goes into Parquet key-value metadata as JSON


# -- one request's failure fails that request alone ------------------------------------

ISOLATION_NEIGHBOURS = 10
ISOLATION_MAX_TOKENS = 12


def poisoned() -> SamplingParams:
    """Sampling that gives no distribution (the checks ``SamplingParams`` runs skipped)."""
    params = SamplingParams(temperature=1.0, seed=0)
    object.__setattr__(params, "temperature", 1e-300)
    return params


async def _outcome(stream) -> list | BaseException:
    try:
        return await drain(stream)
    except Exception as e:
        return e


async def _poisoned_after_first_token(engine: Engine, ids: list[int]) -> list | BaseException:
    """A request whose sampling breaks after its first token: the decode row fails."""
    params = SamplingParams(temperature=1.0, seed=1)
    stream = await engine.submit(ids, ISOLATION_MAX_TOKENS, params)
    events = []
    try:
        async for event in stream:
            events.append(event)
            object.__setattr__(params, "temperature", 1e-300)
    except Exception as e:
        return e
    return events


def test_a_failing_row_fails_only_its_request(model, tok):
    prompts = [tok.ids_of_length(12 + i, seed=i) for i in range(ISOLATION_NEIGHBOURS)]
    engine = Engine(model, tok, EngineConfig(**{**SMALL, "max_running": 16})).start()

    async def main():
        streams = [await engine.submit(ids, ISOLATION_MAX_TOKENS) for ids in prompts]
        bad_first = await engine.submit(
            tok.ids_of_length(9, seed=99), ISOLATION_MAX_TOKENS, poisoned()
        )
        return await asyncio.wait_for(
            asyncio.gather(
                *(_outcome(s) for s in streams),
                _outcome(bad_first),
                _poisoned_after_first_token(engine, tok.ids_of_length(10, seed=98)),
            ),
            60.0,
        )

    try:
        *good, bad_first, bad_decode = asyncio.run(main())
    finally:
        engine.stop()
    assert isinstance(bad_first, SamplingError) and "no distribution" in str(bad_first)
    assert isinstance(bad_decode, SamplingError)
    got = [[e.token_id for e in events] for events in good]
    assert got == [reference(model, tok, ids, ISOLATION_MAX_TOKENS) for ids in prompts]
    assert engine.num_running == 0 and engine.num_waiting == 0
