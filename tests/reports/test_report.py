"""``ttft report``: the HTML report drawn in headless Chromium, and the terminal version."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest
from _browser import LAYOUT, open_offline, overlapping, page, within
from typer.testing import CliRunner

from ttft.analysis.pipeline import analyze
from ttft.collectors import read_spans, write_trace
from ttft.collectors.synthetic import generate
from ttft.reports.cli import app

PLOTS = (
    "stage-bars",
    "ttft-cdf",
    "waterfall-median",
    "waterfall-p99",
    "waterfall-slowest",
    "blame",
    "prefill-scaling",
)
HOSTILE = '</script><script>window.pwned=1</script><img src=x onerror="window.pwned=2">'


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "synth.parquet"
    synthetic = generate(400, seed=7)
    write_trace(path, synthetic.table, synthetic.metadata)
    return path


@pytest.fixture(scope="module")
def report(trace):
    out = trace.parent / "report.html"
    result = CliRunner().invoke(app, ["report", str(trace), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output.replace("\n", "")
    return out


def _summary(trace):
    return analyze(read_spans(trace), trace=str(trace)).summary.to_dict()


def test_report_draws_every_plot_offline_without_console_errors(report):
    with page() as pg:
        errors, refused = open_offline(pg, report)
        drawn = pg.evaluate(
            """() => [...document.querySelectorAll('.js-plotly-plot')].map(d => ({
                id: d.id,
                svg: d.querySelectorAll('svg.main-svg').length,
                traces: d.querySelectorAll('g.trace').length,
                marks: d.querySelectorAll('g.trace path, g.trace .point').length,
                title: (d.querySelector('.gtitle') || {}).textContent || ''}))"""
        )
    assert errors == []
    assert refused == []  # nothing loaded from the network
    assert [d["id"] for d in drawn] == list(PLOTS)
    for d in drawn:
        assert d["svg"] >= 1 and d["traces"] >= 1 and d["marks"] >= 1, d
        assert d["title"], d


def test_report_headline_matches_the_analysis(trace, report):
    summary = _summary(trace)
    page_text = report.read_text()
    for cond, part in summary["conditions"].items():
        assert f"{part['ttft_ms']['p50']:,.2f}" in page_text, cond
        assert f"{part['ttft_ms']['p99']:,.2f}" in page_text, cond
    assert f"{summary['ttft_ms']['p50']:,.2f}" in page_text
    assert "mixes cold and prefix_hit" in page_text
    # The raw-vs-attributed table: the attributed sum is the mean TTFT.
    mean = summary["ttft_ms"]["mean"]
    assert f"the mean TTFT is {mean:,.2f} ms" in page_text
    # plotly's JavaScript is inlined, not fetched.
    assert not re.search(r"<script[^>]+src=", page_text)


def test_hostile_trace_strings_stay_text(tmp_path):
    synthetic = generate(30, seed=2)
    table = synthetic.table
    names = table.column("name").to_pylist()
    names[0] = HOSTILE
    table = table.set_column(table.schema.get_field_index("name"), "name", pa.array(names))
    metadata = dict(synthetic.metadata, note=HOSTILE, model=HOSTILE)
    path = tmp_path / "hostile.parquet"
    write_trace(path, table, metadata)
    out = tmp_path / "hostile.html"
    result = CliRunner().invoke(app, ["report", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    with page() as pg:
        errors, _ = open_offline(pg, out)
        pwned = pg.evaluate("() => window.pwned === undefined ? null : window.pwned")
        rows = pg.evaluate(
            """() => [...document.querySelectorAll('#metadata tr')].slice(1).map(
                r => [...r.cells].map(c => c.textContent))"""
        )
        line = pg.evaluate("() => document.querySelector('#metadata-fold > summary').textContent")
    assert pwned is None
    assert errors == []
    assert ["note", HOSTILE] in rows
    assert line.startswith(f"model {HOSTILE} · workload ")


def test_the_metadata_is_folded_until_clicked(tmp_path):
    """A run's many metadata keys cost one line of the page until the reader opens them."""
    synthetic = generate(60, seed=4)
    many = {f"lib{i:02}": "1.0" for i in range(60)}
    path = tmp_path / "many.parquet"
    write_trace(path, synthetic.table, dict(synthetic.metadata, versions=many))
    out = tmp_path / "many.html"
    assert CliRunner().invoke(app, ["report", str(path), "-o", str(out)]).exit_code == 0
    height = "() => document.documentElement.scrollHeight"
    table = "() => document.getElementById('metadata').getBoundingClientRect().height"
    seen = "() => document.getElementById('metadata').checkVisibility()"
    with page(1280, 900) as pg:
        errors, _ = open_offline(pg, out)
        closed_px, hidden = pg.evaluate(height), not pg.evaluate(seen)
        pg.click("#metadata-fold > summary")
        pg.wait_for_timeout(100)
        opened_px, shown, shown_px = pg.evaluate(height), pg.evaluate(seen), pg.evaluate(table)
    assert errors == []
    assert hidden and shown
    assert shown_px > 60 * 20  # a row is at least 20 px
    assert opened_px - closed_px >= 0.9 * shown_px


def test_terminal_report_tells_the_same_story(trace):
    summary = _summary(trace)
    result = CliRunner().invoke(app, ["report", str(trace)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    out = result.output
    for heading in (
        "headline",
        "where TTFT goes",
        "TTFT distribution",
        "requests up close",
        "raw durations against attributed time",
        "wait blame",
        "prefill compute",
        "run metadata",
    ):
        assert heading in out, heading
    for band in ("p50", "p90", "p99", "tail ≥ p99"):
        assert f"· {band}" in out
    assert f"{summary['ttft_ms']['p50']:,.2f}" in out
    for label in ("median", "p99", "slowest"):
        assert re.search(rf"{label} \((cold|prefix_hit)\)", out), label


def test_report_bad_input_is_one_error(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    result = CliRunner().invoke(app, ["report", str(bad), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2
    assert "bad.parquet" in result.output
    assert not (tmp_path / "r.html").exists()


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """A ``ttft profile-prefill`` trace of the tiny model: prefill chunks, the model config
    and the peaks measured on this machine in its metadata, no requests."""
    path = tmp_path_factory.mktemp("profile") / "profile.parquet"
    result = CliRunner().invoke(
        app,
        [
            "profile-prefill",
            "--model",
            "tiny",
            "--lengths",
            "32,64",
            "--chunk-sizes",
            "32",
            "--repeats",
            "1",
            "--device",
            "cpu",
            "-o",
            str(path),
        ],
    )
    assert result.exit_code == 0, result.output
    return path


def test_report_draws_the_roofline_of_a_profile(profile, tmp_path):
    out = tmp_path / "profile.html"
    result = CliRunner().invoke(app, ["report", str(profile), "-o", str(out)])
    assert result.exit_code == 0, result.output
    with page() as pg:
        errors, _ = open_offline(pg, out)
        marks = pg.evaluate("() => document.querySelectorAll('#roofline g.trace .point').length")
    assert errors == []
    chunks = read_spans(profile).column("stage").to_pylist().count("prefill.chunk")
    assert marks == chunks > 0  # one mark per chunk
    assert "measured)" in out.read_text()  # the roofline's peaks come from the trace


def test_analyze_regime_takes_model_and_peaks_from_flags(trace, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "num_hidden_layers": 8,
                "hidden_size": 512,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "intermediate_size": 1536,
                "vocab_size": 4096,
                "torch_dtype": "bfloat16",
            }
        )
    )
    args = ["analyze", str(trace), "--regime", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["regime"] == {
        "peaks": None, "above_roofline": None, "model_known": False, "rows": []}  # fmt: skip
    result = CliRunner().invoke(
        app,
        [
            *args,
            "--model-config",
            str(config),
            "--peak-tflops",
            "100",
            "--peak-bandwidth-gbs",
            "2000",
        ],
    )
    assert result.exit_code == 0, result.output
    regime = json.loads(result.stdout)["regime"]
    assert regime["peaks"]["source"] == "flags"
    assert regime["peaks"]["flops_per_s"] == 100e12
    assert regime["model_known"] is True
    assert {r["bound"] for r in regime["rows"]} <= {"compute", "memory"}
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    result = CliRunner().invoke(app, [*args, "--model-config", str(bad)])
    assert result.exit_code == 2
    assert "bad.json" in result.stderr


@pytest.mark.parametrize("width", [1400, 900])
def test_report_reads_right_at_each_width(report, tmp_path, width):
    """No JS error; every title, tick label, mark label and event label inside its figure
    and clear of the others; the bands in percentile order in every condition."""
    with page(width, 900) as pg:
        errors, _ = open_offline(pg, report)
        pg.wait_for_timeout(300)
        shot = tmp_path / f"report-{width}.png"
        pg.screenshot(path=str(shot), full_page=True)
        print(f"screenshot {width} px: {shot}")
        figures = pg.evaluate(LAYOUT)
        bundles = pg.evaluate(
            "() => [...document.scripts].filter(s => s.text.includes('* plotly.js')).length"
        )
    assert errors == []
    assert bundles == 1  # plotly's bundle once; the figures' scripts only call it
    assert [d["id"] for d in figures] == list(PLOTS)
    for d in figures:
        where = (width, d["id"])
        assert d["titles"] and d["legend"] and d["xtitle"], where  # the checks see them
        if d["id"].startswith("waterfall-"):
            assert len(d["labels"]) >= 2, where
        assert all(within(b, d) for b in d["titles"] + d["labels"] + d["legend"]), where
        assert overlapping(d["marks"]) == [], where
        assert overlapping([t[1:] for t in d["ticks"]]) == [], where
        assert overlapping(d["labels"]) == [], where
        assert overlapping(d["legend"] + d["xtitle"]) == [], where
    bars = next(d for d in figures if d["id"] == "stage-bars")
    assert len(bars["marks"]) == 12
    assert _band_order(bars) == list(_BAND_TICKS) * 3


def _band_order(bars) -> list[str]:
    """The stage bars' band tick labels left to right (a count in a label dropped)."""
    ticks = [re.sub(r"n=[\d,]+$", "", t[0]) for t in sorted(bars["ticks"], key=lambda t: t[1])]
    return [t for t in ticks if t in _BAND_TICKS]


def test_bands_render_in_percentile_order_when_band_sizes_repeat(tmp_path):
    """150 requests: some condition's band has as many requests as another condition's
    band of the same name, which is what used to reorder plotly's bands."""
    path = tmp_path / "small.parquet"
    synthetic = generate(150, seed=7)
    write_trace(path, synthetic.table, synthetic.metadata)
    out = tmp_path / "small.html"
    result = CliRunner().invoke(app, ["report", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    with page(900, 900) as pg:
        errors, _ = open_offline(pg, out)
        bars = next(d for d in pg.evaluate(LAYOUT) if d["id"] == "stage-bars")
    assert errors == []
    assert _band_order(bars) == list(_BAND_TICKS) * 3


_BAND_TICKS = {"p50": 0, "p90": 1, "p99": 2, "tail≥ p99": 3}
"""The band tick labels as the page's text has them (the tail's on two lines)."""
