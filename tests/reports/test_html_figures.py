"""The HTML report's figures and sections, without a browser: band order, failures, load,
metadata, prefill fits, roofline warnings and the plotly bundle."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd
import plotly
import pytest
from plotly.offline import get_plotlyjs_version

from ttft.analysis.pipeline import analyze
from ttft.analysis.prefill import prefill_fits
from ttft.analysis.regime import Peaks, RegimeResult
from ttft.analysis.summary import BANDS
from ttft.collectors.synthetic import generate
from ttft.reports import _figures, html_report
from ttft.reports.report_data import FIT_MIN_R2, build_report
from ttft.reports.views.metadata import metadata_rows, metadata_summary

BASIC_TRACES = {"scatter", "bar"}


@pytest.fixture(scope="module")
def data():
    return build_report(analyze(generate(300, seed=5).table, trace="synth"))


def _bars_x(fig) -> list[tuple[str, str]]:
    bars = [t for t in fig.data if t.type == "bar"]
    return list(zip(*bars[0].x, strict=True))


def test_bands_are_in_percentile_order_within_every_condition(data):
    """plotly orders each condition's bands by where a band label was first seen in any
    condition: the labels must be the same in every condition, in `BANDS` order."""
    fig = _figures.stage_bars(data)
    pairs = _bars_x(fig)
    for trace in fig.data:
        assert list(zip(*trace.x, strict=True)) == pairs  # every trace on the same slots
    by_group: dict[str, list[str]] = {}
    for group, band in pairs:
        by_group.setdefault(group, []).append(band)
    assert len(by_group) == len(data.bands) == 3
    labels = [b.replace(" ", "<br>", 1) for b in BANDS]
    assert all(bands == labels for bands in by_group.values()), by_group
    # First-seen order over the whole axis is also the band order in each group.
    first_seen = list(dict.fromkeys(band for _, band in pairs))
    assert first_seen == labels


def test_band_counts_sit_on_the_marks(data):
    fig = _figures.stage_bars(data)
    (mark,) = [t for t in fig.data if t.type == "scatter"]
    counts = [int(n) for bands in data.bands.values() for n in bands["requests"]]
    assert [int(re.search(r"n=([\d,]+)", t)[1].replace(",", "")) for t in mark.text] == counts


def test_headline_counts_failures_by_outcome(data):
    failed = dataclasses.replace(data.summary, failures={"http_error": 3, "timeout": 2})
    page = html_report.render_html(dataclasses.replace(data, summary=failed))
    ok = data.summary.requests_ok
    assert (
        f'<div class="failures">5 of {ok + 5:,} requests failed ({5 / (ok + 5):.1%}): '
        "http_error 3, timeout 2</div>" in page
    )
    assert '<div class="ok">no failed requests</div>' in html_report.render_html(
        dataclasses.replace(
            data, summary=dataclasses.replace(data.summary, failures={"http_error": 0})
        )
    )


def test_headline_shows_load_and_goodput_only_when_the_summary_has_them(data):
    load = {
        "duration_s": 20.0,
        "requests": 300,
        "requests_per_s": 15.0,
        "output_tokens": 1200,
        "output_tokens_per_s": 60.0,
        "e2e_ms": {"p50": 250.0, "p90": 400.0, "p99": 700.0, "mean": 280.0, "requests": 300},
    }
    goodput = {"slo": {"ttft_ms": 500.0}, "requests": 270, "share": 0.9, "per_s": 13.5}
    summary = dataclasses.replace(data.summary, load=load, goodput=goodput)
    page = html_report.render_html(dataclasses.replace(data, summary=summary))
    assert '<span class="big">15</span> <span class="unit">requests/s · 300 completed' in page
    assert "output <b>60</b> tokens/s" in page
    assert "end to end p50 <b>250.00</b> ms · p99 <b>700.00</b> ms" in page
    assert "goodput <b>90.0%</b> (270 requests, 13.5/s) meet ttft ≤ 500 ms" in page
    bare = dataclasses.replace(data.summary, load=None, goodput=None)
    page = html_report.render_html(dataclasses.replace(data, summary=bare))
    assert 'class="card load"' not in page


def test_metadata_is_a_table_of_dotted_keys():
    metadata = {
        "seed": 7,
        "model_config": {"hidden_size": 512, "rope": {"theta": 1e4}},
        "inputs": [{"path": "a.parquet"}, {"path": "b.parquet"}],
        "lengths": [32, 64],
        "note": "x" * 300,
        "empty": {},
    }
    assert metadata_rows(metadata) == [
        ("empty", "{}"),
        ("inputs.0.path", "a.parquet"),
        ("inputs.1.path", "b.parquet"),
        ("lengths", "32, 64"),
        ("model_config.hidden_size", "512"),
        ("model_config.rope.theta", "10000.0"),
        ("note", "x" * 300),
        ("seed", "7"),
    ]


def test_metadata_section_has_one_row_per_key(data):
    metadata = {"seed": 5, "model_config": {"hidden_size": 512}, "note": "<b>bold</b>"}
    page = html_report.render_html(dataclasses.replace(data, metadata=metadata))
    table = re.search(r'<table class="meta" id="metadata">(.*?)</table>', page)[1]
    assert re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", table) == [
        ("model_config.hidden_size", "512"),
        ("note", "&lt;b&gt;bold&lt;/b&gt;"),
        ("seed", "5"),
    ]
    assert "<pre>" not in page
    assert "The trace has no run metadata." in html_report.render_html(data)


def _points(cond: str, tokens: np.ndarray, ns: np.ndarray) -> pd.DataFrame:
    n = len(tokens)
    return pd.DataFrame(
        {
            "trace_id": [f"{cond}{i}" for i in range(n)],
            "request_id": [f"{cond}{i}" for i in range(n)],
            "condition": cond,
            "computed_tokens": tokens,
            "cached_tokens": 0,
            "chunks": 1,
            "compute_ns": ns,
        }
    )


def test_prefill_fit_is_drawn_only_when_it_explains_the_data_and_only_where_measured(data):
    rng = np.random.default_rng(3)
    tokens = rng.integers(100, 2000, 80)
    exact = 2e6 + 5e3 * tokens + 0.5 * tokens**2
    points = pd.concat(
        [
            _points("cold", tokens, exact.astype(np.int64)),
            _points("prefix_hit", tokens, rng.uniform(1e6, 5e7, 80).astype(np.int64)),
        ],
        ignore_index=True,
    )
    fits = prefill_fits(points)
    assert fits["cold"].r2 >= FIT_MIN_R2 > fits["prefix_hit"].r2
    shown = dataclasses.replace(data, prefill_points=points, prefill_fits=fits)
    fig = _figures.prefill_scaling(shown)
    lines = [t for t in fig.data if t.mode == "lines"]
    assert [t.name.split(" fit:")[0] for t in lines] == ["cold"]
    (line,) = lines
    assert (min(line.x), max(line.x)) == (tokens.min(), tokens.max())  # never extrapolated
    page = html_report.render_html(shown)
    assert f"over the {tokens.min():,}–{tokens.max():,} tokens measured only" in page
    assert "prefix_hit: no fit drawn: a + b·n + c·n² explains only R² " in page


def _regime(fractions: list[float]) -> RegimeResult:
    peaks = Peaks(flops_per_s=1e12, bytes_per_s=1e11, device="cpu", source="measured")
    n = len(fractions)
    intensity = np.full(n, 50.0)
    achieved = np.array(fractions) * np.minimum(peaks.flops_per_s, intensity * 1e11)
    flops = achieved * 1e-3  # each chunk ran 1 ms
    frame = pd.DataFrame(
        {
            "condition": "cold",
            "chunk_tokens": np.full(n, 32),
            "context_before": np.zeros(n, int),
            "dur_ns": np.full(n, 10**6),
            "flops": flops,
            "bytes": flops / intensity,
            "intensity": intensity,
            "achieved_flops_per_s": achieved,
            "roofline_fraction": fractions,
        }
    )
    summary = pd.DataFrame(
        {
            "condition": "cold",
            "chunk_bucket": [f"{32 * (i + 1)}" for i in range(n)],
            "chunks": 1,
            "median_intensity": intensity,
            "bound": "memory",
            "roofline_fraction": [f if f <= 1 else np.nan for f in fractions],
            "above_roofline": [f > 1 for f in fractions],
            "achieved_flops_per_s": achieved,
        }
    )
    return RegimeResult(frame=frame, summary=summary, peaks=peaks, device_name="cpu")


def test_roofline_fraction_above_one_marks_the_peaks_unreliable(data):
    page = html_report.render_html(dataclasses.replace(data, regime=_regime([1.4, 0.5])))
    section = page[page.index("<h2>Prefill regime</h2>") : page.index("<h2>Raw durations")]
    assert (
        '<p class="warn">achieved exceeds the measured peak (peak measured under load?): 1 of '
        "2 chunks ran above the roofline, up to 1.4 TFLOP/s, so the "
        'device does at least that; they show &quot;above peak&quot;, not a %. The peaks '
        "(measured) are lower" in section
    )
    assert "<td>above peak</td>" in section and "140%" not in section
    page = html_report.render_html(dataclasses.replace(data, regime=_regime([0.9, 0.5])))
    assert "achieved exceeds" not in page and "<td>90%</td>" in page


def test_every_chart_uses_only_the_basic_bundle_traces(data):
    figures = [
        _figures.stage_bars(data),
        _figures.ttft_cdf(data),
        _figures.blame(data),
        _figures.prefill_scaling(data),
        _figures.roofline(dataclasses.replace(data, regime=_regime([0.5]))),
        *(_figures.waterfall(w, "client") for w in data.waterfalls),
    ]
    kinds = {t.type for fig in figures if fig is not None for t in fig.data}
    assert kinds <= BASIC_TRACES, kinds


def test_the_vendored_bundle_is_the_basic_one_at_plotlys_version(data):
    js = html_report.plotly_js()
    assert js.startswith(f"/**\n* plotly.js (basic - minified) v{get_plotlyjs_version()}\n")
    assert html_report.PLOTLY_JS_VERSION == get_plotlyjs_version(), plotly.__version__
    page = html_report.render_html(data)
    assert page.count(js) == 1
    assert page.count("plotly.js (basic - minified)") == 1
    assert len(page.encode()) < 2_000_000


TRACED = {  # what ``ttft trace`` records of a run against ``ttft serve`` (a part of it)
    "command": "ttft trace",
    "arguments": {"arrival": "poisson", "rate": 1.63, "requests": 40, "concurrency": None,
                  "prompt_tokens": [80, 400], "output_tokens": 16, "model": "small"},
    "server": {"model": "small", "url": "http://127.0.0.1:1", "models": {"data": [
        {"id": "small", "ttft": {"device": {"name": "AMD EPYC", "type": "cpu"},
                                 "model_config": {"n_layer": 8}}}]}},
    "versions": {"ttft": "0.1.0"},
}


def test_the_metadata_line_says_model_device_and_workload_and_counts_the_rest():
    assert len(metadata_rows(TRACED)) == 15
    assert metadata_summary(TRACED) == (
        "model small · device AMD EPYC (cpu) · workload ttft trace, 40 requests, poisson at "
        "1.63 req/s, prompts 80–400 tokens, 16 output tokens · 6 more keys")
    validate = {"workload": {"command": "ttft validate", "requests": 8, "concurrency": 1,
                             "prompt_tokens": 40, "max_tokens": 4},
                "engine": {"device": "cpu", "device_name": "cpu",
                           "model": {"n_layer": 2, "d_model": 64}}}
    assert metadata_summary(validate) == (
        "model 2 layers × d_model 64 · device cpu · workload ttft validate, 8 requests, "
        "concurrency 1, prompts 40 tokens, 4 output tokens · 0 more keys")
    synthetic = generate(10, seed=1).metadata
    assert metadata_summary(synthetic) == (
        f"workload ttft.collectors.synthetic, 10 requests, at 20.0 req/s · "
        f"{len(metadata_rows(synthetic)) - 3} more keys")
    assert metadata_summary({"seed": 1, "note": "x"}) == "2 keys"
    assert metadata_summary({}) == "no run metadata"


def test_the_metadata_table_is_folded_under_its_line(data):
    page = html_report.render_html(dataclasses.replace(data, metadata=TRACED))
    line = metadata_summary(TRACED)
    assert (f'<details class="fold" id="metadata-fold"><summary>{line}</summary>'
            '<table class="meta" id="metadata">') in page
    assert "<details open" not in page and " open>" not in page  # every fold starts closed


def test_the_raw_and_regime_tables_fold_under_a_line_and_keep_their_notes(data):
    page = html_report.render_html(dataclasses.replace(data, regime=_regime([0.9, 0.5])))
    stages = len(data.summary.stages)
    assert (f'<details class="fold" id="raw-fold"><summary>per stage: {stages} stages, raw '
            "against attributed mean ms, their overlap and share of TTFT</summary><table>"
            ) in page
    assert ('<details class="fold" id="regime-fold"><summary>per condition and chunk size: '
            "2 rows over 2 chunks (bound: 2 memory)</summary><table>") in page
    # what the tables mean stays in view, after the fold
    fold_end = page.index("</details>", page.index('id="raw-fold"'))
    assert page.index("Adding the stages' durations") > fold_end
    assert page.index("<p class=\"note\">Peaks: ") > page.index('id="regime-fold"')
