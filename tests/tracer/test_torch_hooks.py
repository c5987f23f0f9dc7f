"""Torch module hooks: host forward spans (nesting, step ids, errors, threads) on CPU, the
CUDA-event resolver's anchor math and clamping with fake events, and real CUDA when present."""

from __future__ import annotations

import json
import threading

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ttft.tracer as tt
from ttft.collectors import read_spans
from ttft.collectors.otel_exporter import ParquetSpanExporter
from ttft.tracer.gpu_resolver import CudaEvents, GpuResolver
from ttft.tracer.torch_hooks import instrument_module

B, T, D, VOCAB = 2, 5, 16, 50


@pytest.fixture
def trace(tmp_path):
    """Configure tracing into a Parquet file; ``trace.rows()`` shuts down and reads it."""
    path = tmp_path / "t.parquet"
    tracing = tt.configure("engine", [ParquetSpanExporter(path)], flush_interval_s=0.05)

    class Trace:
        def rows(self):
            tracing.shutdown()
            frame = read_spans(path).to_pandas()
            frame["props"] = [json.loads(a) if a else {} for a in frame["attributes"]]
            return frame

    yield Trace()
    tracing.shutdown()


def one(frame, **where):
    for column, value in where.items():
        frame = frame[frame[column] == value]
    assert len(frame) == 1, f"{len(frame)} rows match {where}"
    return frame.iloc[0]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).unsqueeze(1).chunk(3, dim=-1)  # (B, 1, T, D) each
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # (B, T, VOCAB)


def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T))


def test_linear_forward_is_one_host_span(trace):
    linear = nn.Linear(D, 3)
    with instrument_module(linear) as hooks:
        linear(torch.randn(B, T, D))
    if not torch.cuda.is_available():
        assert hooks.resolver is None  # host spans only
    rows = trace.rows()
    assert len(rows) == 1
    span = one(rows, name="forward")
    assert span.stage == "forward"
    assert pd.isna(span.parent_id)
    assert span.end_ns > span.start_ns
    assert span.props == {"module": "Linear", "timing": "host", "tokens": T, "gpu": "none"}


def test_gpu_false_says_off(trace):
    linear = nn.Linear(D, 3)
    with instrument_module(linear, gpu=False):
        linear(torch.randn(T, D))
    assert one(trace.rows(), name="forward").props["gpu"] == "off"


def test_transformer_per_layer_spans_nest_under_the_forward_inside_a_step(trace):
    model = TinyLM()
    with instrument_module(model, per_layer=True), tt.stage("step", step_id=7):
        logits = model(ids())
    assert logits.shape == (B, T, VOCAB)
    rows = trace.rows()
    step = one(rows, name="step")
    forward = one(rows, name="forward")
    assert forward.parent_id == step.span_id
    assert forward.trace_id == step.trace_id
    assert forward.props == {
        "module": "TinyLM", "timing": "host", "tokens": T, "gpu": "none", "step_id": 7
    }
    layers = rows[rows.name.str.startswith("forward.")].sort_values("start_ns")
    assert list(layers.name) == [
        "forward.embed", "forward.blocks.0", "forward.blocks.1", "forward.norm", "forward.head"
    ]
    assert set(layers.stage) == {"other"}
    assert set(layers.parent_id) == {forward.span_id}
    assert [a["layer"] for a in layers.props] == ["embed", "blocks.0", "blocks.1", "norm", "head"]
    assert [a["module"] for a in layers.props] == [
        "Embedding", "Block", "Block", "LayerNorm", "Linear"
    ]
    assert {a["tokens"] for a in layers.props} == {T}
    assert {a["step_id"] for a in layers.props} == {7}
    assert all("gpu" not in a for a in layers.props)
    assert (layers.start_ns >= forward.start_ns).all()
    assert (layers.end_ns <= forward.end_ns).all()
    assert len(rows) == 7


def test_remove_stops_spans_and_is_idempotent(trace):
    model = TinyLM()
    hooks = instrument_module(model, per_layer=True)
    model(ids())
    hooks.remove()
    hooks.remove()
    model(ids())
    with instrument_module(model):
        model(ids())
    model(ids())
    rows = trace.rows()
    assert len(rows[rows.name == "forward"]) == 2
    assert len(rows[rows.name.str.startswith("forward.")]) == 5


class Boom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad input")


def test_an_exception_closes_the_spans_and_propagates(trace):
    model = nn.Sequential(nn.Linear(D, D), Boom())
    with instrument_module(model, per_layer=True):
        with pytest.raises(ValueError, match="bad input"):
            model(torch.randn(T, D))
        assert tt.current_span() is None  # nothing left open on this thread
        model[0](torch.randn(T, D))  # a child alone: its span, but no forward around it
    rows = trace.rows()
    forward = one(rows, name="forward")
    assert forward.props["error"] == "ValueError"
    failed = one(rows, name="forward.1")
    assert failed.props["error"] == "ValueError"
    assert failed.parent_id == forward.span_id
    ok = rows[rows.name == "forward.0"].sort_values("start_ns")
    assert ok.parent_id.iloc[0] == forward.span_id and pd.isna(ok.parent_id.iloc[1])
    assert all("error" not in a for a in ok.props)


def test_a_forward_called_while_handling_an_exception_is_not_an_error(trace):
    linear = nn.Linear(D, 3)
    with instrument_module(linear):
        try:
            raise KeyError("earlier")
        except KeyError:
            linear(torch.randn(T, D))
    assert "error" not in one(trace.rows(), name="forward").props


def test_hooks_survive_no_grad_and_inference_mode(trace):
    model = TinyLM()
    with instrument_module(model):
        with torch.no_grad():
            model(ids())
        with torch.inference_mode():
            model(ids())
    assert len(trace.rows()) == 2


class Recurse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, depth: int) -> torch.Tensor:
        return self.linear(x) if depth == 0 else self(self.linear(x), depth - 1)


def test_recursive_calls_nest(trace):
    model = Recurse()
    with instrument_module(model, stage="prefill.chunk"):
        model(torch.randn(T, D), 2)
    rows = trace.rows().sort_values("start_ns")
    assert list(rows.stage) == ["prefill.chunk"] * 3
    assert list(rows.parent_id[1:]) == list(rows.span_id[:-1])
    assert pd.isna(rows.parent_id.iloc[0])
    assert list(rows.end_ns) == sorted(rows.end_ns, reverse=True)


class Meet(nn.Module):
    """Both threads are inside its forward at once."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.barrier.wait()
        return x * 2


def test_concurrent_threads_each_nest_under_their_own_step(trace):
    model = Meet(2)
    errors = []

    def run(step_id: int) -> None:
        try:
            with tt.stage("step", step_id=step_id):
                model(torch.ones(step_id, D))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    with instrument_module(model):
        threads = [threading.Thread(target=run, args=(i,)) for i in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    rows = trace.rows()
    for step_id in (1, 2):
        step = rows[(rows.name == "step") & rows.props.map(lambda a, s=step_id: a["step_id"] == s)]
        forward = rows[(rows.name == "forward") & (rows.parent_id == step.span_id.iloc[0])]
        assert len(forward) == 1
        assert forward.props.iloc[0]["step_id"] == step_id
        assert forward.props.iloc[0]["tokens"] == step_id


# -- the CUDA-event resolver, with fake events on CPU --------------------------------------

T0_NS = 1_700_000_000_000_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now_ns = T0_NS

    def __call__(self) -> int:
        return self.now_ns


class FakeEvent:
    """A device event at ``at_ms`` on the device's own timeline; ``done`` once passed."""

    def __init__(self) -> None:
        self.at_ms: float | None = None
        self.done = False
        self.queries = 0
        self.syncs = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.done and end.done, "elapsed_time on an event the device has not passed"
        return end.at_ms - self.at_ms

    def synchronize(self) -> None:
        self.syncs += 1
        self.done = True


class FakeEvents:
    """Every tensor is on device 0; the first event recorded sits at 0 ms (the anchor)."""

    def __init__(self) -> None:
        self.recorded: list[FakeEvent] = []

    def device_of(self, tensor: torch.Tensor) -> int | None:
        return 0

    def new_event(self, device: int) -> FakeEvent:
        return FakeEvent()

    def record(self, event: FakeEvent, device: int) -> None:
        event.at_ms = 0.0
        self.recorded.append(event)


def test_fake_events_map_through_the_anchor_clamp_and_never_block(trace):
    events, clock = FakeEvents(), FakeClock()
    resolver = GpuResolver(events, clock=clock, thread=False)
    model = TinyLM()
    with instrument_module(model, gpu=resolver) as hooks:
        anchor = events.recorded[0]  # taken at instrumentation time, at T0_NS
        assert anchor.syncs == 1
        clock.now_ns = T0_NS + 5_000_000  # forward enqueued 5 ms after the anchor
        with tt.stage("step", step_id=7):
            model(ids())
            clock.now_ns = T0_NS + 20_000_000
            model(ids())
        (start1, end1), (start2, end2) = events.recorded[1:3], events.recorded[3:5]
        start1.at_ms, end1.at_ms = 4.0, 12.5  # device "before" enqueue: clamped to 5 ms
        start2.at_ms, end2.at_ms = 21.25, 30.0
        assert resolver.poll() == 0  # nothing passed yet: nothing emitted, nothing waited on
        assert resolver.pending == 2
        end2.done = start2.done = True  # out of order: each pair on its own
        assert resolver.poll() == 1
        assert resolver.poll() == 0
        end1.done = start1.done = True
        assert resolver.poll() == 1
        assert resolver.pending == 0
        assert [e.syncs for e in events.recorded] == [1, 0, 0, 0, 0]
        assert end1.queries == 4 and end2.queries == 2
        assert hooks.failed == 0 and resolver.failed == 0 and resolver.resolved == 2
    rows = trace.rows()
    forwards = rows[rows.name == "forward"].sort_values("start_ns")
    assert [a["gpu"] for a in forwards.props] == ["gpu:0", "gpu:0"]
    gpu = rows[rows.name == "gpu"]
    by_parent = {p: g for p, g in zip(gpu.parent_id, gpu.itertuples(), strict=True)}
    first, second = (by_parent[s] for s in forwards.span_id)
    assert (first.start_ns, first.end_ns) == (T0_NS + 5_000_000, T0_NS + 12_500_000)
    assert (second.start_ns, second.end_ns) == (T0_NS + 21_250_000, T0_NS + 30_000_000)
    assert set(gpu.stage) == {"gpu"} and set(gpu.clock) == {"gpu:0"}
    assert set(gpu.trace_id) == set(forwards.trace_id)
    assert first.props == {
        "timing": "device", "module": "TinyLM", "tokens": T, "step_id": 7, "clamped_ns": 1_000_000
    }
    assert "clamped_ns" not in second.props


def test_reanchoring_applies_to_later_launches_only(trace):
    events, clock = FakeEvents(), FakeClock()
    resolver = GpuResolver(events, clock=clock, thread=False)
    linear = nn.Linear(D, 3)
    with instrument_module(linear, gpu=resolver):
        linear(torch.randn(T, D))  # launched under the first anchor (T0, 0 ms)
        clock.now_ns = T0_NS + 10_000_000_000
        resolver.anchor(0)  # device event at 0 ms of its own timeline, seen at T0 + 10 s
        linear(torch.randn(T, D))
        for event, at_ms in zip(events.recorded[1:], (1.0, 2.0, 0.0, 3.0, 4.0), strict=True):
            event.at_ms, event.done = at_ms, True
        assert resolver.poll() == 2
    rows = trace.rows()
    gpu = rows[rows.name == "gpu"].sort_values("start_ns")
    assert list(gpu.start_ns) == [T0_NS + 1_000_000, T0_NS + 10_003_000_000]
    assert list(gpu.end_ns) == [T0_NS + 2_000_000, T0_NS + 10_004_000_000]


def test_the_resolver_thread_emits_without_being_asked(trace):
    events = FakeEvents()
    resolver = GpuResolver(events, poll_interval_s=0.001)
    try:
        linear = nn.Linear(D, 3)
        with instrument_module(linear, gpu=resolver):
            linear(torch.randn(T, D))
            for event in events.recorded[1:]:
                event.done = True
            for _ in range(2000):
                if resolver.resolved:
                    break
                threading.Event().wait(0.001)
    finally:
        resolver.close()
    assert resolver.resolved == 1 and resolver.failed == 0
    rows = trace.rows()
    assert one(rows, name="gpu").parent_id == one(rows, name="forward").span_id


def test_close_counts_pairs_the_device_never_passed(trace):
    events = FakeEvents()
    resolver = GpuResolver(events, thread=False)
    linear = nn.Linear(D, 3)
    with instrument_module(linear, gpu=resolver):
        linear(torch.randn(T, D))
    resolver.close(timeout_s=0.01)
    assert (resolver.resolved, resolver.failed, resolver.pending) == (0, 1, 0)
    assert list(trace.rows().name) == ["forward"]


def test_cpu_tensors_get_no_cuda_events():
    assert CudaEvents().device_of(torch.ones(2)) is None


# -- real CUDA ------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
def test_cuda_forward_has_a_device_span_inside_its_launch(trace):
    model = TinyLM().cuda()
    with instrument_module(model) as hooks, torch.no_grad():
        for _ in range(3):
            model(ids().cuda())
    assert hooks.resolver is not None and hooks.resolver.failed == 0
    rows = trace.rows()
    forwards = rows[rows.name == "forward"]
    gpu = rows[rows.name == "gpu"]
    assert len(forwards) == len(gpu) == 3
    index = torch.cuda.current_device()
    assert set(gpu.clock) == {f"gpu:{index}"}
    assert {a["gpu"] for a in forwards.props} == {f"gpu:{index}"}
    for span in gpu.itertuples():
        forward = one(forwards, span_id=span.parent_id)
        assert span.start_ns >= forward.start_ns
        assert span.end_ns > span.start_ns
        assert span.props["timing"] == "device"


@needs_cuda
def test_cuda_device_time_outlasts_the_enqueue_of_a_long_kernel(trace):
    linear = nn.Linear(4096, 4096).cuda()
    x = torch.randn(8, 4096, 4096, device="cuda")
    with instrument_module(linear), torch.no_grad():
        linear(x)
    rows = trace.rows()
    forward, gpu = one(rows, name="forward"), one(rows, name="gpu")
    assert gpu.end_ns > forward.start_ns
    assert gpu.end_ns - gpu.start_ns > 0
