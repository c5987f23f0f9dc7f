"""The device micro-benchmark and the engine's ``engine_info`` start-up event."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

import pytest
import torch

from ttft.engine import Engine, EngineConfig, peaks
from ttft.engine.model import ModelConfig, Transformer
from ttft.engine.peaks import ENGINE_INFO, measure_peaks, record_engine_info
from ttft.engine.tokenizer import Tokenizer

MEASURED = {"peak_flops_per_s", "peak_bytes_per_s", "peaks_source", "matmul_dtype"}


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer.from_config(ModelConfig.preset("tiny"), seed=0)


def check_figures(out: dict, device_type: str) -> None:
    for key in ("peak_flops_per_s", "peak_bytes_per_s"):
        assert isinstance(out[key], float) and math.isfinite(out[key]) and out[key] > 0, key
    assert out["type"] == device_type and out["peaks_source"] == "measured"
    assert out["name"] and out["copy_bytes"] > 0 and out["matmul_n"] >= 128


def test_cpu_peaks_are_positive_and_within_the_budget():
    start = time.perf_counter()
    out = measure_peaks("cpu", budget_s=0.2)
    elapsed_s = time.perf_counter() - start
    check_figures(out, "cpu")
    assert out["matmul_dtype"] == "float32"
    # The budget bounds the measuring, not the wall clock of a busy machine: a guard
    # against a run that ignores it, with room for a shared 2-core box.
    assert elapsed_s < 0.2 * 15, elapsed_s
    assert out["measure_ns"] / 1e9 <= elapsed_s


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peaks_are_positive_and_within_the_budget():
    measure_peaks("cuda", budget_s=0.1)  # CUDA context and cuBLAS start-up, not timed
    start = time.perf_counter()
    out = measure_peaks("cuda", budget_s=0.2)
    assert time.perf_counter() - start < 0.2 * 3
    check_figures(out, "cuda")
    assert out["matmul_dtype"] == "bfloat16" and out["index"] == torch.cuda.current_device()


def test_cpu_peaks_are_the_best_of_slices_over_sizes_and_threads_are_restored():
    threads = torch.get_num_threads()
    out = measure_peaks("cpu", budget_s=0.3)
    assert torch.get_num_threads() == threads  # every other slice ran one thread
    assert out["threads"] == threads and out["matmul_threads"] in (1, threads)
    assert out["rounds"] >= 1 and out["matmul_n"] in out["matmul_sizes"]
    assert 1 <= len(out["matmul_sizes"]) <= 3 and out["matmul_sizes"] == sorted(
        out["matmul_sizes"]
    )
    # The best slice is the peak; the median of the slices tells how busy the machine was.
    assert 0 < out["median_flops_per_s"] <= out["peak_flops_per_s"]
    assert 0 < out["median_bytes_per_s"] <= out["peak_bytes_per_s"]


def test_best_peaks_keeps_the_best_of_each_figure():
    base = {"name": "cpu x", "type": "cpu", "peaks_source": "measured", "threads": 2}
    loaded = {**base, "peak_flops_per_s": 3.5e8, "peak_bytes_per_s": 9e9, "matmul_n": 128,
              "rounds": 2, "median_flops_per_s": 1e8, "median_bytes_per_s": 5e9,
              "measure_ns": 300}  # fmt: skip
    calm = {**base, "peak_flops_per_s": 1.6e11, "peak_bytes_per_s": 4e9, "matmul_n": 512,
            "rounds": 6, "median_flops_per_s": 1.2e11, "median_bytes_per_s": 3e9,
            "measure_ns": 1000}  # fmt: skip
    best = peaks.best_peaks(loaded, calm)
    assert best == {**base, "peak_flops_per_s": 1.6e11, "matmul_n": 512,
                    "peak_bytes_per_s": 9e9, "rounds": 8, "median_flops_per_s": 1.2e11,
                    "median_bytes_per_s": 3e9, "measure_ns": 1300}  # fmt: skip
    with pytest.raises(ValueError, match="different devices"):
        peaks.best_peaks(loaded, {**calm, "name": "other"})
    with pytest.raises(ValueError, match="at least one"):
        peaks.best_peaks()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="cpu or cuda"):
        measure_peaks("meta")
    with pytest.raises(ValueError, match="budget_s"):
        measure_peaks("cpu", budget_s=0)


def test_untraced_engine_info_measures_nothing_and_records_nothing(model, monkeypatch):
    monkeypatch.setattr(peaks, "cached_peaks", lambda *a, **k: pytest.fail("measured"))
    assert record_engine_info(model) == {"name": peaks.device_name("cpu"), "type": "cpu"}
    monkeypatch.setenv(peaks.SKIP_ENV, "1")
    assert not MEASURED & set(record_engine_info(model, measure=True))


def test_traced_engine_records_engine_info_with_model_and_peaks(
    model, collect, tmp_path, monkeypatch
):
    monkeypatch.delenv(peaks.SKIP_ENV, raising=False)
    exporter, tracing = collect
    tok = Tokenizer.load(cache_dir=tmp_path)
    engine = Engine(model, tok, EngineConfig(num_blocks=64, block_size=8))

    async def main():
        return [e async for e in await engine.submit(tok.ids_of_length(12, seed=3), 2)]

    engine.start()
    try:
        asyncio.run(main())
    finally:
        engine.stop()
    tracing.flush()
    (info,) = [s for s in exporter.spans if s.name == ENGINE_INFO]
    attrs = dict(info.attributes)
    assert attrs["ttft.stage"] == "event" and info.start_time == info.end_time
    assert info.parent is None and "ttft.request_id" not in attrs
    request_traces = {s.context.trace_id for s in exporter.spans if s.name == "tokenize"}
    assert info.context.trace_id not in request_traces  # the engine's own trace
    for field, value in dataclasses.asdict(model.config).items():
        assert attrs[f"model.{field}"] == value, field
    assert attrs["model.dtype"] == "float32"
    assert attrs["device.type"] == "cpu" and attrs["device.peaks_source"] == "measured"
    assert attrs["device.peak_flops_per_s"] > 0 and attrs["device.peak_bytes_per_s"] > 0
    assert engine.device_info["peak_flops_per_s"] == attrs["device.peak_flops_per_s"]


def test_measure_peaks_false_keeps_only_the_device_name(model, collect, tmp_path):
    exporter, tracing = collect
    engine = Engine(model, Tokenizer.load(cache_dir=tmp_path), measure_peaks=False)
    engine.start()
    engine.stop()
    tracing.flush()
    (info,) = [s for s in exporter.spans if s.name == ENGINE_INFO]
    assert info.attributes["device.type"] == "cpu"
    assert "device.peak_flops_per_s" not in info.attributes
    assert engine.device_info == {"name": peaks.device_name("cpu"), "type": "cpu"}
