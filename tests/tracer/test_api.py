"""The instrumentation API: nesting, trace context across tasks and threads, links,
explicit-time records, and a tracer that never breaks the traced program."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time

import pytest
from _live import Collect
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import ttft.tracer as tt
from ttft.collectors import read_spans
from ttft.collectors.otel_exporter import ParquetSpanExporter

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def by_name(spans):
    return {s.name: s for s in spans}


def test_traceparent_round_trip_and_invalid_values():
    assert tt.parse_traceparent(PARENT) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        True,
    )
    assert tt.format_traceparent(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331) == PARENT
    for bad in (
        None,
        "",
        "garbage",
        "ff-" + PARENT[3:],
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",
        PARENT.replace("b7ad6b7169203331", "0" * 16),
    ):
        assert tt.parse_traceparent(bad) is None


def test_stages_nest_and_join_the_incoming_trace(collect):
    exporter, tracing = collect
    with tt.request_context(PARENT, "r1"):
        with tt.stage("server", path="/v1/completions") as server:
            with tt.stage("tokenize", prompt_tokens=12) as tok:
                tok.set(extra=1)
            tt.event("first_byte")
    result = tracing.flush()
    assert (result.exported, result.dropped, result.failed) == (3, 0, 0)
    spans = by_name(exporter.spans)
    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    assert {s.context.trace_id for s in exporter.spans} == {trace_id}
    assert spans["server"].parent.span_id == 0xB7AD6B7169203331
    assert spans["server"].parent.is_remote
    assert spans["tokenize"].parent.span_id == server.span_id
    assert spans["first_byte"].parent.span_id == server.span_id
    assert dict(spans["tokenize"].attributes) == {
        "ttft.stage": "tokenize",
        "ttft.clock": tracing.recorder.default_clock,
        "ttft.request_id": "r1",
        "prompt_tokens": 12,
        "extra": 1,
    }
    event = spans["first_byte"]
    assert event.start_time == event.end_time
    assert event.attributes["ttft.stage"] == "event"
    assert spans["tokenize"].start_time >= spans["server"].start_time
    assert spans["tokenize"].end_time <= spans["server"].end_time
    assert exporter.spans[0].resource.attributes["service.name"] == "engine"


def test_without_a_request_a_stage_is_an_engine_span_in_its_own_trace(collect):
    exporter, tracing = collect
    with tt.stage("step", step_id=3) as step:
        with tt.stage("forward"):
            pass
    with tt.stage("step", step_id=4) as other:
        pass
    tracing.flush()
    spans = {(s.name, s.attributes.get("step_id")): s for s in exporter.spans}
    assert spans[("step", 3)].parent is None
    assert "ttft.request_id" not in spans[("step", 3)].attributes
    assert spans[("forward", None)].parent.span_id == step.span_id
    assert step.trace_id != other.trace_id


def test_engine_thread_stages_join_the_request_by_id(collect):
    exporter, tracing = collect

    def engine(request_id: str) -> None:
        with tt.stage("queue", request_id=request_id):
            time.sleep(0.001)
        with tt.stage("step") as step:
            tt.link_step(step, [request_id, "unknown"])

    with tt.request_context(None, "r2") as root:
        with tt.stage("server") as server:
            worker = threading.Thread(target=engine, args=("r2",))
            worker.start()
            worker.join()
    tracing.flush()
    spans = by_name(exporter.spans)
    assert spans["queue"].context.trace_id == root.trace_id
    assert spans["queue"].parent.span_id == server.span_id
    step = spans["step"]
    assert step.context.trace_id != root.trace_id  # engine-level, its own trace
    assert [(link.context.trace_id, link.context.span_id) for link in step.links] == [
        (root.trace_id, server.span_id)
    ]
    assert step.attributes["request_ids"] == ("r2", "unknown")


def test_a_request_not_sampled_records_nothing_and_gets_no_link(collect):
    exporter, tracing = collect
    unsampled = PARENT[:-2] + "00"
    sampled = f"00-{'1' * 32}-{'2' * 16}-01"

    def engine(request_id: str) -> None:
        parent = tt.request_parent(request_id)
        with tt.stage("queue", request_id=request_id):
            pass
        chunk = tt.record("prefill", 1, 2, parent=parent)
        tt.record("prefill.chunk", 1, 2, parent=chunk)
        with tt.stage("step") as step:
            tt.link_step(step, [request_id])
            linked = [tt.add_link(step, ref) for ref in (parent, chunk, tt.request_parent("r4"))]
        assert linked == [False, False, True]

    with tt.request_context(unsampled, "r3") as root:
        assert not root.sampled and root.traceparent == unsampled  # propagated as it came
        with tt.stage("server") as server:
            assert not server.sampled and not tt.request_parent("r3").sampled
            with tt.stage("tokenize"):
                tt.event("first_byte")
            with tt.request_context(sampled, "r4"):  # a sampled request meanwhile
                worker = threading.Thread(target=engine, args=("r3",))
                worker.start()
                worker.join()
    assert tt.new_request_root("r5").sampled
    tracing.flush()
    (step,) = exporter.spans  # the engine's own span only
    assert step.name == "step"
    assert [(link.context.trace_id, link.context.span_id) for link in step.links] == [
        (int("1" * 32, 16), int("2" * 16, 16))  # r4's
    ]
    assert step.attributes["request_ids"] == ("r3",)
    assert tracing.recorder.result().dropped == 0  # not sampled is not dropped: never queued


def test_context_follows_asyncio_tasks(collect):
    exporter, tracing = collect

    async def handler(rid: str) -> None:
        with tt.request_context(None, rid):
            with tt.stage("server"):
                await asyncio.gather(child("tokenize"), child("detokenize"))

    async def child(name: str) -> None:
        await asyncio.sleep(0.001)
        with tt.stage(name):
            await asyncio.sleep(0.001)

    async def main() -> None:
        await asyncio.gather(handler("a"), handler("b"))

    asyncio.run(main())
    tracing.flush()
    servers = {s.attributes["ttft.request_id"]: s for s in exporter.spans if s.name == "server"}
    for span in exporter.spans:
        if span.name in ("tokenize", "detokenize"):
            own = servers[span.attributes["ttft.request_id"]]
            assert span.parent.span_id == own.context.span_id
            assert span.context.trace_id == own.context.trace_id


def test_decorator_records_each_call(collect):
    exporter, tracing = collect

    @tt.stage("sample", kind="greedy")
    def pick(x: int) -> int:
        return x + 1

    @tt.stage("detokenize")
    async def text(x: int) -> str:
        return str(x)

    assert pick(1) == 2 and pick(2) == 3
    assert asyncio.run(text(5)) == "5"
    tracing.flush()
    assert sorted(s.name for s in exporter.spans) == ["detokenize", "sample", "sample"]
    assert all(s.attributes.get("kind") == "greedy" for s in exporter.spans if s.name == "sample")


def test_exception_closes_the_span_and_propagates(collect):
    exporter, tracing = collect
    with pytest.raises(ZeroDivisionError), tt.stage("sample"):
        _ = 1 / 0
    tracing.flush()
    assert exporter.spans[0].attributes["error"] == "ZeroDivisionError"
    assert tt.current_span() is None


def test_record_takes_explicit_times_and_clock(collect):
    exporter, tracing = collect
    with tt.stage("forward") as forward:
        start = tt.clock_ns()
    gpu = tt.record("gpu", start + 10, start + 500, parent=forward, clock="gpu:0", step_id=9)
    tt.record("gpu", start + 600, start + 550, parent=gpu)  # end before start: clamped
    tracing.flush()
    spans = [s for s in exporter.spans if s.name == "gpu"]
    assert (spans[0].start_time, spans[0].end_time) == (start + 10, start + 500)
    assert spans[0].parent.span_id == forward.span_id
    assert spans[0].attributes["ttft.clock"] == "gpu:0"
    assert spans[1].start_time == spans[1].end_time == start + 600


def test_full_buffer_drops_and_counts_without_blocking():
    class Slow(Collect):
        def export(self, spans):
            time.sleep(0.2)
            return super().export(spans)

    exporter = Slow()
    tracing = tt.configure("engine", [exporter], capacity=100, flush_interval_s=10)
    try:
        started = time.perf_counter()
        for _ in range(1000):
            with tt.stage("queue"):
                pass
        assert time.perf_counter() - started < 1.0  # never waited for the exporter
        result = tracing.flush(timeout_s=10)
        assert result.dropped >= 800
        assert result.exported + result.dropped == 1000
        assert len(exporter.spans) == result.exported
    finally:
        tracing.shutdown()


def test_an_exporter_that_raises_or_refuses_loses_only_its_batches():
    class Raises(SpanExporter):
        def export(self, spans):
            raise RuntimeError("backend down")

        def shutdown(self):
            raise RuntimeError("still down")

    class Refuses(Collect):
        def export(self, spans):
            return SpanExportResult.FAILURE

    good = Collect()
    tracing = tt.configure("engine", [Raises(), Refuses(), good], flush_interval_s=0.01)
    for _ in range(5):
        with tt.stage("queue"):
            pass
    result = tracing.shutdown()
    assert len(good.spans) == 5
    assert (result.exported, result.failed, result.dropped) == (5, 10, 0)


def test_blocked_exporter_does_not_block_shutdown_forever():
    release = threading.Event()

    class Blocks(Collect):
        def export(self, spans):
            release.wait(5)
            return super().export(spans)

    tracing = tt.configure("engine", [Blocks()], flush_interval_s=0.01)
    with tt.stage("queue"):
        pass
    time.sleep(0.05)  # the export thread is now stuck in export()
    started = time.perf_counter()
    tracing.shutdown(timeout_s=0.3)
    assert time.perf_counter() - started < 2.0
    release.set()
    with tt.stage("queue"):  # after shutdown: nothing recorded, nothing raised
        pass


def test_unwritable_output_directory_keeps_the_program_running(tmp_path):
    path = tmp_path / "run.parquet"
    exporter = ParquetSpanExporter(path, flush_spans=1)
    tracing = tt.configure("engine", [exporter], flush_interval_s=0.01)
    parts = tmp_path / "run.parquet.parts"
    shutil.rmtree(parts)
    parts.write_text("not a directory any more")
    for _ in range(3):
        with tt.stage("queue"):
            pass
    result = tracing.shutdown()
    assert result.exported == 0 and result.failed == 3


def test_parquet_round_trip_through_the_exporter(tmp_path):
    path = tmp_path / "t.parquet"
    tracing = tt.configure("engine", [ParquetSpanExporter(path)], flush_interval_s=0.01)
    with tt.request_context(PARENT, "r9"), tt.stage("server"):
        with tt.stage("prefill.chunk", step_id=4, cached_tokens=0):
            pass
        tt.event("first_byte")
    tracing.shutdown()
    rows = read_spans(path).to_pandas().set_index("name")
    assert rows.loc["server", "parent_id"] == "b7ad6b7169203331"
    assert rows.loc["prefill.chunk", "stage"] == "prefill.chunk"
    assert json.loads(rows.loc["prefill.chunk", "attributes"]) == {"step_id": 4, "cached_tokens": 0}
    assert rows.loc["first_byte", "stage"] == "event"
    assert set(rows.request_id) == {"r9"}


def test_tracer_provider_spans_go_out_with_the_rest(collect):
    exporter, tracing = collect
    tracer = tracing.tracer_provider.get_tracer("user")
    with tracer.start_as_current_span("user.work"):
        pass
    tracing.flush()
    assert [s.name for s in exporter.spans] == ["user.work"]


def test_calls_before_configure_record_nothing_and_do_not_raise():
    with tt.stage("queue") as span:
        span.set(a=1)
    tt.event("first_byte")
    tt.record("gpu", 1, 2)


def test_end_at_ends_the_span_at_a_chosen_time(collect):
    exporter, tracing = collect
    with tt.stage("server") as server:
        mid = tt.clock_ns()
        server.end_at(mid)
        time.sleep(0.01)  # background work after the response
    with tt.stage("queue") as early:
        early.end_at(0)  # before its start: clamped to the start
    tracing.flush()
    spans = by_name(exporter.spans)
    assert spans["server"].end_time == mid
    assert spans["queue"].end_time == spans["queue"].start_time


def test_stats_reports_counts_without_flushing(collect):
    exporter, tracing = collect
    with tt.stage("queue"):
        pass
    tracing.flush()
    current = tt.stats()
    assert (current.exported, current.dropped, current.failed) == (1, 0, 0)
    tracing.shutdown()
    assert tt.stats() is None


def test_queued_spans_hold_nothing_the_garbage_collector_traverses():
    """A queue of finished spans costs the traced program no collection work: each is a
    tuple of plain values (its attributes kept apart), untracked by the first collection
    that sees it; queued as objects, collections were about a third of every span's cost
    (benchmarks/tracing_overhead.py). The attributes still reach the exporter."""
    import gc

    class Keep(SpanExporter):
        def __init__(self):
            self.spans = []

        def export(self, spans):
            self.spans += spans
            return SpanExportResult.SUCCESS

    keep = Keep()
    tracing = tt.configure("gc", [keep], capacity=10_000, flush_interval_s=3600)
    try:
        with tt.stage("server", request_id="r1"):
            for i in range(1_000):
                with tt.stage("queue", step_id=i, note="x"):
                    pass
            tt.event("first_byte")
        gc.collect(0)
        queued = list(tracing.recorder._queue)
        assert len(queued) == 1_002
        assert [r for r in queued if gc.is_tracked(r)] == []
    finally:
        tracing.shutdown(timeout_s=30)
    queues = [s for s in keep.spans if s.name == "queue"]
    assert sorted(s.attributes["step_id"] for s in queues) == list(range(1_000))
    assert all(s.attributes["note"] == "x" and s.attributes["ttft.request_id"] == "r1"
               for s in queues)


def test_a_batch_that_fails_to_convert_leaves_no_attributes_behind(monkeypatch):
    """The recorder keeps queued spans' attributes apart by span id; a batch whose
    conversion fails (logged, the thread lives on) takes its attributes with it, and the
    spans after it are exported as usual."""
    from ttft.tracer.recorder import Recorder

    keep = []

    class Keep(SpanExporter):
        def export(self, spans):
            keep.extend(spans)
            return SpanExportResult.SUCCESS

    tracing = tt.configure("fail", [Keep()], capacity=1_000, flush_interval_s=3600)
    convert = Recorder._to_spans
    calls = []

    def once(self, batch):
        calls.append(len(batch))
        if len(calls) == 1:
            raise RuntimeError("conversion failed")
        return convert(self, batch)

    monkeypatch.setattr(Recorder, "_to_spans", once)
    try:
        for i in range(10):
            with tt.stage("queue", step_id=i):
                pass
        tracing.flush(10.0)
        assert tracing.recorder._attributes == {}
        with tt.stage("queue", step_id=10):
            pass
        tracing.flush(10.0)
    finally:
        tracing.shutdown(timeout_s=30)
    assert calls[0] == 10 and [s.attributes["step_id"] for s in keep] == [10]
    assert tracing.recorder._attributes == {}
