"""``ttft profile-prefill`` on the tiny model: the trace it writes (one trace per timed
run, the engine's chunk attributes, model and measured device in the metadata), what it
prints, its refusals; and the regime view's table and missing-input lines."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
from collections import Counter

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from ttft.analysis.assemble import assemble
from ttft.analysis.prefill import QuadraticFit
from ttft.analysis.regime import (
    ModelShape,
    Peaks,
    RegimeResult,
    find_model_and_device,
    regime,
    regime_summary,
)
from ttft.collectors import read_spans, run_metadata
from ttft.engine.model import ModelConfig
from ttft.reports.cli import app
from ttft.reports.cli.profile_prefill import _print_fit, _render
from ttft.reports.runs.profile_prefill import RUN_COLUMNS, ProfileRun, profile_summary
from ttft.reports.views.regime import render_regime

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
    # A busy machine can make the times too noisy for a fit: then the points, no formula.
    assert len(fits) == 4 and all(
        ("R²" in line and "µs·n" in line) or "no good quadratic fit (R² " in line
        for line in fits
    )
    assert "wrote" in result.stderr


def _profile_run(path, **device) -> ProfileRun:
    """The fixture's trace as `run_profile` returned it, its device's figures replaced."""
    table, meta = read_spans(path), run_metadata(read_spans(path))
    runs = []
    for r in table.to_pylist():
        if r["name"] == "prefill":
            a = json.loads(r["attributes"])
            runs.append((r["trace_id"], a["condition"], a["prompt_tokens"], a["chunk_size"],
                         a["cached_tokens"], a["repeat"]))  # fmt: skip
    meta = {**meta, "device": {**meta["device"], **device}}
    return ProfileRun(table, meta, pd.DataFrame(runs, columns=list(RUN_COLUMNS)))


def _printed(summary, run) -> str:
    console = Console(width=200, record=True, color_system=None)
    _render(run.metadata, summary, console)
    return console.export_text()


def test_a_chunk_above_the_measured_peak_shows_words_not_a_percentage(profiled):
    # Peaks as a busy machine measured them: far below what the chunks did.
    run = _profile_run(profiled[0], peak_flops_per_s=1e3, peak_bytes_per_s=1e3)
    summary = profile_summary(run)
    assert summary.rows["above_roofline"].all() and summary.rows["roofline_fraction"].isna().all()
    excess = summary.excess
    assert excess.chunks == excess.of_chunks > 0 and excess.flops and excess.bytes
    frame = regime(assemble(run.table), ModelShape.from_dict(run.metadata["model_config"]),
                   summary.peaks)  # fmt: skip
    assert excess.best_flops_per_s == frame["achieved_flops_per_s"].max() > 1e3
    text = _printed(summary, run)
    assert "achieved exceeds the measured peak (peak measured under load?): " in text
    assert f"{excess.chunks:,} of {excess.of_chunks:,} prefill chunks ran above" in text
    assert "compute above peak" in text or "memory above peak" in text
    assert not re.search(r"(compute|memory) \d+%", text)  # no percentage, let alone > 100%
    # Peaks above what the chunks did: percentages, no warning.
    fair = profile_summary(_profile_run(profiled[0], peak_flops_per_s=1e15,
                                        peak_bytes_per_s=1e15))  # fmt: skip
    assert fair.excess is None and (fair.rows["roofline_fraction"] < 1).all()
    assert "achieved exceeds" not in _printed(fair, run)


def _fit_lines(fit: QuadraticFit, chunk: int = 256) -> str:
    part = pd.DataFrame({"chunk_size": [128, 256, 256], "computed_tokens": [128, 512, 2048],
                         "time_ns": [1.52e9, 3.45e9, 46.05e9]})  # fmt: skip
    console = Console(width=300, record=True, color_system=None)
    _print_fit(console, chunk, fit, part)
    return console.export_text()


def test_a_fit_under_r2_0_9_is_printed_as_its_points_not_as_coefficients():
    poor = QuadraticFit(a_ns=1.1e9, b_ns_per_token=-6.1e5, c_ns_per_token2=1.1e4, r2=0.47,
                        points=9)  # fmt: skip
    text = _fit_lines(poor)
    assert text.strip() == (
        "fit, chunk 256 (n = tokens computed): no good quadratic fit (R² 0.47, under 0.9, 9 "
        "runs): the times vary too much to follow a + b·n + c·n²; medians n 128: 1,520.00 "
        "ms, n 512: 3,450.00 ms, n 2,048: 46,050.00 ms"
    )
    assert "µs·n" not in text and "ns·n²" not in text and "−" not in text


def test_a_good_fit_with_a_negative_term_says_it_is_no_cost_model():
    good = QuadraticFit(a_ns=1.1e9, b_ns_per_token=-6.1e5, c_ns_per_token2=1.1e4, r2=0.99,
                        points=9)  # fmt: skip
    lines = _fit_lines(good).strip().splitlines()
    assert lines[0].strip() == (
        "fit, chunk 256 (n = tokens computed): time ≈ 1100 ms − 610 µs·n + 1.1e+04 ns·n²  "
        "(R² 0.9900, 9 runs)"
    )
    assert lines[1].strip() == (
        "negative b (cost per token): no prefill costs less than nothing; the formula fits "
        "the 128–2,048 tokens measured and is no cost model to read outside them"
    )
    positive = dataclasses.replace(good, b_ns_per_token=6.1e5)
    assert len(_fit_lines(positive).strip().splitlines()) == 1


def test_analyze_of_a_profile_trace_says_what_it_is_and_shows_the_regime(profiled):
    path, _ = profiled
    result = runner.invoke(app, ["analyze", str(path), "--regime"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    runs = sum(1 for r in read_spans(path).to_pylist() if r["name"] == "prefill")
    assert " ".join(out.split()).startswith(
        f"ttft analyze {path}: a prefill profile (ttft profile-prefill): {runs:,} timed "
        "prefill runs of the tiny model, no requests: TTFT, its stages and request defects "
        "do not apply prefill regime"
    )
    assert "requests=0" not in out and "no_window" not in out and "data quality" not in out
    assert "prefill regime" in out and "measured on the traced machine" in out
    plain_run = runner.invoke(app, ["analyze", str(path)], env={"COLUMNS": "160"})
    assert plain_run.exit_code == 0 and "add --regime" in plain_run.stdout
    assert "requests=0" not in plain_run.stdout


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


def render(frame, summary, peaks, device_name=None) -> str:
    buf = io.StringIO()
    render_regime(RegimeResult(frame, summary, peaks, device_name),
                  Console(file=buf, width=160, highlight=False))
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
