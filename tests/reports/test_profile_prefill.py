"""``ttft profile-prefill`` on the tiny model: the trace it writes (one trace per timed
run, the engine's chunk attributes, model and measured device in the metadata), what it
prints, its refusals; and the regime view's table and missing-input lines."""

from __future__ import annotations

import io
import json
import math
from collections import Counter

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from ttft.analysis.assemble import assemble
from ttft.analysis.regime import ModelShape, Peaks, find_model_and_device, regime, regime_summary
from ttft.collectors import read_spans, run_metadata
from ttft.engine.model import ModelConfig
from ttft.reports.cli import app
from ttft.reports.regime_view import render_regime

runner = CliRunner()
TINY = ["--model", "tiny", "--device", "cpu"]
# (length, condition) -> (cached tokens, {chunk size: chunk tokens of one run})
EXPECTED = {
    (32, "cold"): (0, {32: [32]}),
    (32, "prefix_hit"): (16, {16: [16]}),  # half of 32 in whole 16-token blocks
    (64, "cold"): (0, {32: [32, 32], 64: [64]}),
    (64, "prefix_hit"): (32, {32: [32]}),  # both sizes cover the 32 left in one chunk
    (128, "cold"): (0, {32: [32] * 4, 64: [64, 64]}),
    (128, "prefix_hit"): (64, {32: [32, 32], 64: [64]}),
}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "trace.parquet"
    args = ["profile-prefill", *TINY, "--lengths", "32,64,128", "--chunk-sizes", "32,64",
            "--prefix-reuse", "--repeats", "2", "-o", str(path)]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "140"})
    assert result.exit_code == 0, result.output
    return path, result


def test_trace_has_one_trace_per_timed_run_with_the_engine_chunk_attributes(profiled):
    path, _ = profiled
    rows = read_spans(path).to_pylist()
    for r in rows:
        r["attributes"] = json.loads(r["attributes"])
    envelopes = {r["span_id"]: r for r in rows if r["name"] == "prefill"}
    chunks: dict[str, list[dict]] = {}
    for r in rows:
        if r["name"] == "prefill.chunk":
            assert r["stage"] == "prefill.chunk" and r["end_ns"] > r["start_ns"]
            chunks.setdefault(r["parent_id"], []).append(r)
    assert set(chunks) == set(envelopes) and len(rows) == len(envelopes) + sum(
        len(c) for c in chunks.values()
    )
    seen: Counter = Counter()
    for span_id, env in envelopes.items():
        a = env["attributes"]
        cached, runs = EXPECTED[(a["prompt_tokens"], a["condition"])]
        mine = sorted(chunks[span_id], key=lambda r: r["start_ns"])
        assert [c["attributes"]["chunk_tokens"] for c in mine] == runs[a["chunk_size"]]
        assert {c["trace_id"] for c in mine} == {env["trace_id"]}
        assert [c["attributes"]["cached_tokens"] for c in mine] == [cached] * len(mine)
        context = [c["attributes"]["context_tokens"] for c in mine]
        assert context[-1] == a["prompt_tokens"] and context == sorted(context)
        assert a["cached_tokens"] == cached and a["chunks"] == len(mine)
        assert (env["start_ns"], env["end_ns"]) == (mine[0]["start_ns"], mine[-1]["end_ns"])
        seen[(a["prompt_tokens"], a["condition"], a["chunk_size"])] += 1
    expected_runs = {(n, cond, c): 2 for (n, cond), (_, runs) in EXPECTED.items() for c in runs}
    assert dict(seen) == expected_runs
    assert len({r["trace_id"] for r in rows}) == len(envelopes)
    step_ids = [r["attributes"]["step_id"] for r in rows if r["name"] == "prefill.chunk"]
    assert sorted(step_ids) == list(range(len(step_ids)))


def test_metadata_holds_model_config_and_measured_device_peaks(profiled):
    path, _ = profiled
    meta = run_metadata(read_spans(path))
    tiny = ModelConfig.preset("tiny")
    assert meta["model_config"]["n_layer"] == tiny.n_layer
    assert meta["model_config"]["dtype"] == "float32"
    device = meta["device"]
    assert device["type"] == "cpu" and device["peaks_source"] == "measured"
    assert device["peak_flops_per_s"] > 0 and device["peak_bytes_per_s"] > 0
    assert (meta["lengths"], meta["chunk_sizes"], meta["repeats"]) == ([32, 64, 128], [32, 64], 2)
    assert meta["prefix_reuse"] is True
    model, found = find_model_and_device(read_spans(path), meta)
    assert ModelShape.from_dict(model).n_layer == tiny.n_layer and found == device


def test_prints_both_conditions_and_the_fits(profiled):
    _, result = profiled
    out = result.stdout
    assert "prefill: cold" in out and "prefill: prefix_hit" in out
    for header in ("length", "chunk", "time ms", "tokens/s", "FLOP/s", "regime"):
        assert header in out
    assert "measured on the traced machine" in out
    fits = [line for line in out.splitlines() if "fit, chunk" in line]
    assert len(fits) == 4 and all("R²" in line and "µs·n" in line for line in fits)
    assert "wrote" in result.stderr


def test_length_above_max_seq_len_is_refused(tmp_path):
    out = tmp_path / "t.parquet"
    result = runner.invoke(app, ["profile-prefill", *TINY, "--lengths", "64,1024", "-o", str(out)])
    assert result.exit_code == 2
    assert "length(s) 1024 exceed the tiny model's max_seq_len 512" in result.stderr
    assert not out.exists()


def test_bad_lists_are_refused(tmp_path):
    out = str(tmp_path / "t.parquet")
    result = runner.invoke(app, ["profile-prefill", *TINY, "--chunk-sizes", "32,x", "-o", out])
    assert result.exit_code == 2 and "--chunk-sizes: expected comma-separated" in result.stderr
    result = runner.invoke(app, ["profile-prefill", *TINY, "--lengths", "0", "-o", out])
    assert result.exit_code == 2 and "positive" in result.stderr


def test_default_lengths_skip_those_above_the_model_with_a_note(tmp_path):
    out = tmp_path / "t.parquet"
    args = ["profile-prefill", *TINY, "--repeats", "1", "--warmup", "0", "-o", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "skipping default length(s) 2048, 4096" in result.stderr
    assert run_metadata(read_spans(out))["lengths"] == [128, 512]


def render(*args, **kwargs) -> str:
    buf = io.StringIO()
    render_regime(*args, Console(file=buf, width=160, highlight=False), **kwargs)
    return buf.getvalue()


def test_regime_view_names_missing_inputs_and_the_flags():
    text = render(None, None, None, device_name="Intel Xeon")
    assert "--model-config FILE.json" in text
    assert "'Intel Xeon'" in text and "--peak-tflops" in text and "--peak-bandwidth-gbs" in text


def test_regime_view_table_and_peaks_source(profiled):
    path, _ = profiled
    table, meta = read_spans(path), run_metadata(read_spans(path))
    shape = ModelShape.from_dict(meta["model_config"])
    peaks = Peaks(989e12, 3.35e12, "NVIDIA H100 80GB HBM3 (as H100 SXM)", "known-gpu")
    asm = assemble(table)
    frame = regime(asm, shape, peaks)
    summary = regime_summary(frame)
    assert not frame.empty and set(summary["condition"]) == {"cold", "prefix_hit", "all"}
    text = render(frame, summary, peaks)
    assert "all (mixes cold and prefix_hit)" in text and "memory" in text
    assert "989 TFLOP/s, 3.35 TB/s (ridge 295 FLOP/B)" in text
    assert "known-GPU datasheet table" in text
    no_peaks = render(regime(asm, shape, None), regime_summary(regime(asm, shape, None)), None)
    assert "--peak-tflops" in no_peaks and "prefill regime" in no_peaks
    empty = regime(assemble(table.slice(0, 0)), shape, peaks)
    assert "no prefill.chunk spans" in render(empty, regime_summary(empty), peaks)
    assert isinstance(frame, pd.DataFrame) and math.isfinite(frame["intensity"].iloc[0])
