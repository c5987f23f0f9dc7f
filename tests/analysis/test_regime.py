"""Prefill regime: the cost model on a hand-computed config, the roofline placement, where
peaks and the model come from, and the per-chunk frame and its summary."""

from __future__ import annotations

import dataclasses
import math
import socket

import numpy as np
import pandas as pd
import pytest
from _build import event, row, table, tid
from hypothesis import given, settings
from hypothesis import strategies as st

from ttft.analysis.assemble import assemble
from ttft.analysis.regime import (
    FRAME_COLUMNS,
    KNOWN_GPUS,
    SUMMARY_COLUMNS,
    ModelShape,
    Peaks,
    RooflineExcess,
    chunk_bucket,
    chunk_cost,
    find_model_and_device,
    find_peaks,
    known_gpu,
    regime,
    regime_summary,
    roofline_excess,
    roofline_place,
)
from ttft.engine.model import ModelConfig

# 1 layer, d_model 4, 2 heads of 2, 1 K/V head, SwiGLU 8 wide, vocab 10, 2-byte weights.
HAND = ModelShape(n_layer=1, d_model=4, n_head=2, n_kv_head=1, d_ff=8, vocab=10, dtype_bytes=2)
BASE = ModelShape.from_dict({**dataclasses.asdict(ModelConfig.preset("base")), "dtype": "bf16"})
H100 = Peaks(989e12, 3.35e12, "NVIDIA H100 80GB HBM3", "known-gpu")


def test_chunk_cost_of_a_hand_computed_config():
    # layer params: wq 4·4 + wo 4·4 + wk 4·2 + wv 4·2 + w1, w3, w2 3·4·8 = 144
    assert HAND.layer_params == 144
    # 3 tokens after 5 cached: pairs 3·5 + 3·4/2 = 21
    flops = 2 * 144 * 3 + 4 * 2 * 2 * 21 + 2 * 4 * 10  # projections, attention, head
    weights = 144 + 2 * 4 + 4 + 4 * 10  # layer, its 2 norms, final norm, output head
    kv = (5 + 3) * 2 * 1 * 2  # read 5 and write 3 positions of K and V, 1 head of 2
    per_token = (7 * 4 + 4 * 4 + 2 * 2 + 3 * 8) + 4  # GEMM/attention operands, embedding
    activations = 3 * per_token + 4 + 10  # plus the head's input and logits
    assert (flops, 2 * (weights + kv + activations)) == (1280, 940)
    assert chunk_cost(HAND, 3, 5) == (1280, 940)


def test_from_dict_reads_engine_and_hugging_face_names():
    engine = {"n_layer": 1, "d_model": 4, "n_head": 2, "n_kv_head": 1, "d_ff": 8,
              "vocab_size": 10, "max_seq_len": 512, "dtype": "bfloat16"}  # fmt: skip
    hf = {"num_hidden_layers": 1, "hidden_size": 4, "num_attention_heads": 2,
          "num_key_value_heads": 1, "intermediate_size": 8, "vocab_size": 10,
          "torch_dtype": "float16", "architectures": ["LlamaForCausalLM"]}  # fmt: skip
    assert ModelShape.from_dict(engine) == HAND
    assert ModelShape.from_dict(hf) == HAND
    assert ModelShape.from_dict({**hf, "torch_dtype": None}, dtype="torch.float32").dtype_bytes == 4
    no_kv = {k: v for k, v in hf.items() if k != "num_key_value_heads"}
    assert ModelShape.from_dict(no_kv).n_kv_head == 2  # multi-head attention
    assert ModelShape.from_dict({**hf, "head_dim": 8}).layer_params == 2 * 4 * 16 + 2 * 4 * 8 + 96
    with pytest.raises(ValueError, match="dtype / torch_dtype"):
        ModelShape.from_dict({k: v for k, v in engine.items() if k != "dtype"})
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        ModelShape.from_dict(engine, dtype="int3")


def test_intensity_grows_with_chunk_tokens():
    intensity = [np.divide(*chunk_cost(BASE, t, 1024)) for t in (1, 4, 16, 64, 256, 1024, 4096)]
    assert intensity == sorted(intensity) and len(set(intensity)) == len(intensity)


def test_large_chunk_is_compute_bound_and_one_token_memory_bound_on_an_h100():
    big = np.divide(*chunk_cost(BASE, 2048, 0))
    one = np.divide(*chunk_cost(BASE, 1, 2048))
    assert big > H100.ridge > one
    assert one < 2  # a decode-like chunk reads every weight for one token


def chunk_table(durations_ns: list[int]) -> tuple:
    """One cold request (trace 1) chunked 4 + 2 and a prefix hit (trace 2, 3 cached)."""
    rows = [
        row(1, 1, "prefill", 0, 10**6, cached_tokens=0),
        row(1, 2, "prefill.chunk", 0, durations_ns[0], parent=1, step_id=0, chunk_tokens=4,
            cached_tokens=0, context_tokens=4),
        row(1, 3, "prefill.chunk", 10**5, 10**5 + durations_ns[1], parent=1, step_id=1,
            chunk_tokens=2, cached_tokens=0, context_tokens=6),
        row(2, 4, "prefill", 0, 10**6, cached_tokens=3),
        row(2, 5, "prefill.chunk", 0, durations_ns[2], parent=4, chunk_tokens=3,
            cached_tokens=3),  # no context_tokens: cached tokens stand in
        row(3, 6, "step", 0, 10**6, step_id=0),
    ]  # fmt: skip
    return table(rows)


def test_regime_frame_is_exact_for_made_up_durations():
    peaks = Peaks(flops_per_s=1e12, bytes_per_s=1e11, device="made-up", source="flags")
    frame = regime(assemble(chunk_table([1000, 2000, 0])), HAND, peaks)
    assert list(frame.columns) == list(FRAME_COLUMNS)
    assert frame["trace_id"].tolist() == [tid(1), tid(1), tid(2)]
    assert frame["condition"].tolist() == ["cold", "cold", "prefix_hit"]
    assert frame["chunk_tokens"].tolist() == [4, 2, 3]
    assert frame["context_before"].tolist() == [0, 4, 3]
    costs = [chunk_cost(HAND, 4, 0), chunk_cost(HAND, 2, 4), chunk_cost(HAND, 3, 3)]
    assert frame["flops"].tolist() == [c[0] for c in costs]
    assert frame["bytes"].tolist() == [c[1] for c in costs]
    f, b = costs[0]
    intensity = f / b
    assert frame["intensity"].iloc[0] == intensity
    assert frame["ridge"].tolist() == [10.0] * 3
    assert frame["bound"].tolist() == ["memory"] * 3  # the hand model is tiny: ~1 FLOP/B
    assert frame["attainable_flops_per_s"].iloc[0] == min(1e12, intensity * 1e11)
    assert frame["achieved_flops_per_s"].iloc[0] == f / 1e-6
    assert frame["roofline_fraction"].iloc[0] == (f / 1e-6) / (intensity * 1e11)
    assert frame["above_roofline"].tolist() == [False] * 3
    assert math.isnan(frame["achieved_flops_per_s"].iloc[2])  # zero duration
    assert math.isnan(frame["roofline_fraction"].iloc[2])


def test_a_chunk_above_its_roofline_gets_no_fraction_and_the_excess_names_the_best_rate():
    # Peaks measured under load: 1.4 MFLOP/s and 0.1 MB/s, while the chunks did ~1 GFLOP/s.
    peaks = Peaks(flops_per_s=1.4e6, bytes_per_s=1e5, device="cpu", source="measured")
    frame = regime(assemble(chunk_table([1000, 2000, 10**9])), HAND, peaks)
    achieved = frame["achieved_flops_per_s"].tolist()
    attainable = frame["attainable_flops_per_s"].tolist()
    assert [a > b for a, b in zip(achieved, attainable, strict=True)] == [True, True, False]
    assert frame["above_roofline"].tolist() == [True, True, False]
    fractions = frame["roofline_fraction"].tolist()
    assert math.isnan(fractions[0]) and math.isnan(fractions[1])
    assert fractions[2] == achieved[2] / attainable[2] < 1
    excess = roofline_excess(frame)
    seconds = np.array([1000, 2000, 10**9]) / 1e9
    assert excess == RooflineExcess(
        chunks=2, of_chunks=3, best_flops_per_s=max(achieved),
        best_bytes_per_s=float(np.max(frame["bytes"].to_numpy() / seconds)),
        flops=True, bytes=True,
    )  # fmt: skip
    summary = regime_summary(frame)
    cold = summary[(summary["condition"] == "cold") & (summary["chunk_bucket"] == "all")]
    assert cold["above_roofline"].tolist() == [True]
    assert cold["roofline_fraction"].isna().all()
    assert (summary["roofline_fraction"].dropna() <= 1).all()
    # On (or under) the roofline everywhere: no excess.
    assert roofline_excess(frame, Peaks(1e15, 1e15, "cpu", "measured")) is None
    assert roofline_excess(regime(assemble(chunk_table([1, 2, 3])), HAND, None)) is None


def test_roofline_place_of_scalars_and_arrays():
    peaks = Peaks(flops_per_s=100.0, bytes_per_s=10.0, device="x", source="flags")  # ridge 10
    assert roofline_place(peaks, 20.0, 50.0) == {
        "bound": "compute", "attainable_flops_per_s": 100.0, "roofline_fraction": 0.5,
        "above_roofline": False,
    }  # fmt: skip
    over = roofline_place(peaks, 2.0, 30.0)  # memory-bound: attainable 2 × 10 = 20
    assert (over["bound"], over["attainable_flops_per_s"], over["above_roofline"]) == (
        "memory", 20.0, True)  # fmt: skip
    assert math.isnan(over["roofline_fraction"])
    out = roofline_place(peaks, np.array([20.0, 2.0]), np.array([np.nan, 10.0]))
    assert out["above_roofline"].tolist() == [False, False]
    assert math.isnan(out["roofline_fraction"][0]) and out["roofline_fraction"][1] == 0.5
    none = roofline_place(None, 20.0, 50.0)
    assert none["bound"] is None and none["above_roofline"] is False


def test_regime_without_peaks_or_chunks():
    frame = regime(assemble(chunk_table([1000, 2000, 3000])), HAND, None)
    assert frame["bound"].tolist() == [None] * 3
    assert frame[["ridge", "attainable_flops_per_s", "roofline_fraction"]].isna().all().all()
    assert frame["achieved_flops_per_s"].notna().all()
    empty = regime(assemble(table([row(1, 1, "step", 0, 5)])), HAND, H100)
    assert empty.empty and list(empty.columns) == list(FRAME_COLUMNS)
    assert regime_summary(empty).empty


def test_regime_names_chunks_by_their_request():
    rows = [
        row(1, 1, "server", 0, 10**6, cached_tokens=8, request_id="r1"),
        row(2, 1, "prefill.chunk", 0, 1000, chunk_tokens=4, cached_tokens=8, request_id="r1"),
        row(3, 1, "prefill.chunk", 2000, 3000, chunk_tokens=4, context_tokens=16,
            request_id="r1"),
    ]  # fmt: skip
    frame = regime(assemble(table(rows)), HAND, None)
    assert frame["trace_id"].tolist() == [tid(1), tid(1)]  # the request's smallest trace id
    assert frame["condition"].tolist() == ["prefix_hit", "prefix_hit"]
    assert frame["context_before"].tolist() == [8, 12]


def test_summary_per_condition_and_bucket():
    big = ModelShape.from_dict(dataclasses.asdict(ModelConfig.preset("small")), dtype="float32")
    peaks = Peaks(1e18, 1e17, "cpu", "measured")  # above what the made-up durations achieve
    frame = regime(assemble(chunk_table([1000, 2000, 3000])), big, peaks)
    summary = regime_summary(frame)
    assert list(summary.columns) == list(SUMMARY_COLUMNS)
    keys = list(zip(summary["condition"], summary["chunk_bucket"], strict=True))
    assert keys == [
        ("cold", "2-3"), ("cold", "4-7"), ("cold", "all"), ("prefix_hit", "2-3"),
        ("prefix_hit", "all"), ("all", "2-3"), ("all", "4-7"), ("all", "all"),
    ]  # fmt: skip
    cold = summary.iloc[2]
    flops, nbytes = frame["flops"][:2].sum(), frame["bytes"][:2].sum()
    assert (cold["chunks"], cold["tokens"]) == (2, 6)
    assert cold["achieved_flops_per_s"] == flops / (3000 / 1e9)
    assert cold["attainable_flops_per_s"] == min(1e18, flops / nbytes * 1e17)
    achieved, attainable = cold["achieved_flops_per_s"], cold["attainable_flops_per_s"]
    assert cold["roofline_fraction"] == achieved / attainable < 1
    assert not summary["above_roofline"].any()
    assert cold["bound"] == "memory" and cold["ridge"] == 10.0
    assert [chunk_bucket(n) for n in (1, 2, 3, 4, 255, 256, 1024)] == [
        "1", "2-3", "2-3", "4-7", "128-255", "256-511", "1024-2047"]  # fmt: skip


def test_find_peaks_priority():
    measured = {"name": "NVIDIA H200", "peak_flops_per_s": 7e14, "peak_bytes_per_s": 4e12}
    flags = {"peak_flops_per_s": 1e12, "peak_bytes_per_s": 1e11}
    assert find_peaks({"device": measured}, flags) == Peaks(7e14, 4e12, "NVIDIA H200", "measured")
    by_name = find_peaks({"device": {"name": "NVIDIA H200"}}, flags)
    assert by_name == Peaks(989e12, 4.8e12, "NVIDIA H200 (as H200)", "known-gpu")
    legacy = find_peaks({"engine": {"device_name": "NVIDIA A100-SXM4-80GB"}}, None)
    assert (legacy.flops_per_s, legacy.bytes_per_s) == (312e12, 2.039e12)
    assert find_peaks({"device": {"name": "cpu"}}, flags) == Peaks(1e12, 1e11, "cpu", "flags")
    assert find_peaks({}, flags).source == "flags"
    assert find_peaks({"device": {"name": "cpu", "peak_flops_per_s": float("nan")}}, {}) is None
    assert find_peaks(None, {"peak_flops_per_s": 1e12}) is None  # half the flags


def test_find_peaks_never_measures_this_machine(monkeypatch):
    import ttft.engine.peaks as engine_peaks

    monkeypatch.setattr(engine_peaks, "measure_peaks", lambda *a, **k: pytest.fail("measured"))
    local = {"device": {"name": socket.gethostname()}, "engine": {"device": "cpu"}}
    assert find_peaks(local, None) is None


def test_known_gpu_names():
    cases = {
        "NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H100 PCIe": "H100 PCIe",
        "NVIDIA H100 NVL": "H100 NVL", "NVIDIA H200": "H200", "NVIDIA H200 NVL": "H200 NVL",
        "NVIDIA A100-SXM4-40GB": "A100 40GB", "NVIDIA A100 80GB PCIe": "A100 80GB",
        "NVIDIA A100-SXM4-80GB": "A100 80GB", "NVIDIA L4": "L4", "NVIDIA L40S": "L40S",
        "NVIDIA A10G": "A10G", "NVIDIA A10": "A10", "NVIDIA GeForce RTX 4090": "RTX 4090",
    }  # fmt: skip
    assert {name: known_gpu(name).name for name in cases} == cases
    assert known_gpu("NVIDIA L40") is None and known_gpu("Intel(R) Xeon(R)") is None
    assert all(g.flops_per_s / g.bytes_per_s > 50 for g in KNOWN_GPUS)  # sane ridges


def test_find_model_and_device_reads_metadata_then_the_engine_info_event():
    meta = {"model_config": {"n_layer": 1}, "device": {"name": "NVIDIA L4"}}
    info = event(9, 1, "engine_info", 5, **{"model.n_layer": 2, "model.dtype": "float32",
                 "device.name": "NVIDIA H200", "device.peak_flops_per_s": 1.0})  # fmt: skip
    spans = table([row(1, 1, "step", 0, 5), info])
    assert find_model_and_device(spans, meta) == (meta["model_config"], meta["device"])
    model, device = find_model_and_device(spans, {})
    assert model == {"n_layer": 2, "dtype": "float32"}
    assert device == {"name": "NVIDIA H200", "peak_flops_per_s": 1.0}
    legacy = {"engine": {"model": {"n_layer": 3}, "dtype": "bfloat16", "device": "cuda:0",
                         "device_name": "NVIDIA L4"}}  # fmt: skip
    assert find_model_and_device(table([]), legacy) == (
        {"n_layer": 3, "dtype": "bfloat16"},
        {"name": "NVIDIA L4", "type": "cuda:0"},
    )
    assert find_model_and_device(None, None) == (None, None)


def test_summary_leaves_out_all_when_every_chunk_has_one_condition():
    frame = regime(assemble(chunk_table([1000, 2000, 3000])), HAND, H100)
    cold = frame[frame["condition"] == "cold"]
    summary = regime_summary(cold, H100)
    assert list(zip(summary["condition"], summary["chunk_bucket"], strict=True)) == [
        ("cold", "2-3"), ("cold", "4-7"), ("cold", "all")]  # fmt: skip
    unknown = cold.assign(condition=None)  # chunks of no known condition: only "all"
    assert set(regime_summary(unknown, H100)["condition"]) == {"all"}



def _mixed_chunks() -> pd.DataFrame:
    """The chunks of 60 synthetic requests (cold and prefix hits), some of no known
    condition, with durations from -5 ns (a defect) to 5 ms."""
    from ttft.collectors.synthetic import generate

    slow = Peaks(1e6, 1e4, "slow", "flags")
    frame = regime(assemble(generate(60, seed=2).table), HAND, slow)
    rng = np.random.default_rng(5)
    unknown = rng.random(len(frame)) < 0.2
    frame["condition"] = frame["condition"].where(~unknown, None)
    frame["dur_ns"] = rng.integers(-5, 5_000_000, len(frame))
    return frame


MIXED = _mixed_chunks()


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False), st.lists(st.integers(0, 400), max_size=5))
def test_regime_figures_do_not_depend_on_how_chunks_are_split_or_ordered(rand, cuts):
    """Over any split of the chunks into parts, in any order, the summary and excess are
    one frame's, bit for bit (exact sums, exact medians); they agree with pandas' own sums
    and median to rounding."""
    from ttft.analysis.order_stats import InMemory
    from ttft.analysis.roofline import regime_figures

    order = list(range(len(MIXED)))
    rand.shuffle(order)
    shuffled = MIXED.iloc[order].reset_index(drop=True)
    pieces = [shuffled.iloc[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), None],
                                                  strict=True)]
    slow = Peaks(1e6, 1e4, "slow", "flags")
    for peaks in (None, slow, H100):
        summary, excess = regime_figures(InMemory(pieces), peaks)
        whole, whole_excess = regime_figures(InMemory([MIXED]), peaks)
        pd.testing.assert_frame_equal(summary, whole, check_exact=True)
        assert excess == whole_excess
        assert (excess is not None) == (peaks is slow)
    assert regime_summary(MIXED).equals(regime_summary(MIXED, slow))  # its own peaks
    assert roofline_excess(MIXED) == roofline_excess(MIXED, slow) is not None


def test_regime_figures_agree_with_pandas_sums_and_medians():
    slow = Peaks(1e6, 1e4, "slow", "flags")
    summary = regime_summary(MIXED, slow)
    assert {"cold", "prefix_hit", "all"} <= set(summary["condition"]) and len(summary) > 6
    buckets = MIXED["chunk_tokens"].map(chunk_bucket)
    for r in summary.itertuples():
        mask = (MIXED["condition"] == r.condition if r.condition != "all"
                else pd.Series(True, index=MIXED.index))
        if r.chunk_bucket != "all":
            mask &= buckets == r.chunk_bucket
        g = MIXED[mask]
        assert (r.chunks, r.tokens) == (len(g), int(g["chunk_tokens"].sum()))
        assert r.median_intensity == float(g["intensity"].median())
        assert r.compute_bound_share == float((g["bound"] == "compute").mean())
        intensity = float(g["flops"].sum()) / float(g["bytes"].sum())
        assert math.isclose(r.attainable_flops_per_s,
                            min(slow.flops_per_s, intensity * slow.bytes_per_s), rel_tol=1e-12)
        seconds = float(g["dur_ns"].clip(lower=0).sum()) / 1e9
        assert math.isclose(r.achieved_flops_per_s, float(g["flops"].sum()) / seconds,
                            rel_tol=1e-12)
