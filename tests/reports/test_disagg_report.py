"""Disaggregated serving in the reports: each worker's spans on lanes named by the worker
and the K/V transfer on a lane of its own (waterfalls and Perfetto), the transfer's
bandwidth in ``analyze`` (terminal and ``--json``) and ``report`` (terminal and HTML) only
when the trace has transfers, and ``ttft compare`` of co-located against disaggregated."""

from __future__ import annotations

import html
import io
import json

import numpy as np
import pytest
from _browser import LAYOUT, open_offline, overlapping, page, within
from _build import table
from _disagg import (
    DECODE_CLOCK,
    DECODE_SERVICE,
    METADATA_COLOCATED,
    METADATA_DISAGG,
    PREFILL_CLOCK,
    PREFILL_SERVICE,
    disaggregate,
    two_workers,
)
from rich.cells import cell_len
from typer.testing import CliRunner

from ttft.analysis import analyze
from ttft.analysis.compare import compare
from ttft.analysis.transfer import deployment_note
from ttft.collectors import write_trace
from ttft.collectors.synthetic import generate
from ttft.reports._text import PlainConsole
from ttft.reports.cli import app
from ttft.reports.html_report import render_html
from ttft.reports.perfetto import perfetto_events, validate_events
from ttft.reports.report_data import build_report, lane_order
from ttft.reports.terminal import render_analysis
from ttft.reports.views.transfer import TITLE, rate_text

runner = CliRunner()
PREFILL = f"{PREFILL_SERVICE} @ {PREFILL_CLOCK}"
DECODE = f"{DECODE_SERVICE} @ {DECODE_CLOCK}"


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("disagg")
    synthetic = generate(120, seed=5)
    colocated = write_trace(folder / "colocated.parquet", synthetic.table, METADATA_COLOCATED)
    disagg = write_trace(folder / "disagg.parquet", disaggregate(synthetic.table),
                         METADATA_DISAGG)
    return {"colocated": str(colocated), "disagg": str(disagg), "folder": folder}


def test_each_worker_has_its_lanes_and_the_transfer_one_of_its_own():
    (w,) = build_report(analyze(table(two_workers()))).waterfalls
    starts_ns = (w.spans["start_ms"] * 1e6).round().astype(int).astype(str)
    lanes = dict(zip(w.spans["name"] + "@" + starts_ns, w.spans["lane"], strict=True))
    assert lanes == {
        "client@0": "client · 1",
        "server@2": f"{DECODE} · 1",
        "tokenize@4": f"{DECODE} · 2",
        "queue@10": f"{PREFILL} · 1",
        "prefill@20": f"{PREFILL} · 1",
        "prefill.chunk@20": f"{PREFILL} · 2",
        "kv_transfer@30": f"{DECODE} kv_transfer · 1",
        "prefill.chunk@45": f"{PREFILL} · 2",
        "queue@75": f"{DECODE} · 2",
        "sample@80": f"{DECODE} · 2",
        "stream@88": f"{DECODE} · 2",
    }
    # The transfer's lane holds it alone, though it overlaps both chunks.
    on_lane = w.spans[w.spans["lane"] == f"{DECODE} kv_transfer · 1"]
    assert on_lane["stage"].tolist() == ["kv_transfer"]
    assert dict(zip([e[0] for e in w.events], w.event_lanes, strict=True)) == {
        "sent": "client · 1", "first_sampled": f"{DECODE} · 1",
        "first_byte": f"{DECODE} · 1", "first_token": "client · 1",
    }
    assert lane_order(w.spans["lane"]) == [
        "client · 1", f"{PREFILL} · 1", f"{PREFILL} · 2", f"{DECODE} · 1", f"{DECODE} · 2",
        f"{DECODE} kv_transfer · 1",
    ]


def test_a_colocated_request_keeps_its_clock_lanes():
    rows = [dict(r, service="engine") if r["clock"] != "client" else r for r in two_workers()]
    (w,) = build_report(analyze(table(rows))).waterfalls
    assert set(w.spans["lane"]) == {
        "client · 1", "host:a · 1", "host:a · 2", "host:a kv_transfer · 1",
        "host:a/prefill · 1", "host:a/prefill · 2",
    }


def test_lane_order_by_worker_with_steps_and_transfers_after_its_own_lanes():
    lanes = ["gpu:0 · 1", "b @ host:a steps · 1", "b @ host:a kv_transfer · 1",
             "a @ host:z · 1", "client · 1", "b @ host:a · 2", "b @ host:a · 1",
             "a @ gpu:0 · 1"]
    assert lane_order(lanes) == [
        "client · 1", "a @ host:z · 1", "b @ host:a · 1", "b @ host:a · 2",
        "b @ host:a kv_transfer · 1", "b @ host:a steps · 1", "a @ gpu:0 · 1", "gpu:0 · 1",
    ]


def test_perfetto_puts_each_worker_in_its_process_and_the_transfer_on_its_own_track():
    events = perfetto_events(table(two_workers()))
    assert validate_events(events) == []
    process = {e["pid"]: e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "process_name"}
    begun = [(process[e["pid"]], e["name"], e["id2"]["local"].rsplit(".", 1)[1])
             for e in events if e["ph"] == "b"]
    assert sorted(begun) == sorted([
        (f"{PREFILL_SERVICE} · {PREFILL_CLOCK}", "queue", "0"),
        (f"{PREFILL_SERVICE} · {PREFILL_CLOCK}", "prefill", "0"),
        # the chunks nest inside the prefill envelope, on its lane
        (f"{PREFILL_SERVICE} · {PREFILL_CLOCK}", "prefill.chunk", "0"),
        (f"{PREFILL_SERVICE} · {PREFILL_CLOCK}", "prefill.chunk", "0"),
        (f"{DECODE_SERVICE} · {DECODE_CLOCK}", "tokenize", "0"),
        (f"{DECODE_SERVICE} · {DECODE_CLOCK}", "kv_transfer", "kv_transfer"),
        (f"{DECODE_SERVICE} · {DECODE_CLOCK}", "queue", "0"),
        (f"{DECODE_SERVICE} · {DECODE_CLOCK}", "sample", "0"),
        (f"{DECODE_SERVICE} · {DECODE_CLOCK}", "stream", "0"),
    ])
    (kv,) = [e for e in events if e["ph"] == "b" and e["name"] == "kv_transfer"]
    assert kv["args"]["attributes"] == {"ttft.kv.blocks": 4, "ttft.kv.bytes": 4 * 65536}


def test_the_html_report_shows_the_transfer_only_when_there_is_one(traces):
    with_kv = analyze(disaggregate(generate(120, seed=5).table))
    page_text = render_html(build_report(with_kv))
    kv = with_kv.summary.kv_transfer
    assert 'id="kv-transfer"' in page_text and f"<h2>{html.escape(TITLE)}</h2>" in page_text
    bw = kv["bytes_per_s"]
    assert f"{rate_text(bw['p50'])} / {rate_text(bw['p90'])}" in page_text
    assert f"{rate_text(bw['min'])} / {rate_text(bw['max'])}" in page_text
    assert f"{kv['requests']:,}" in page_text
    plain = render_html(build_report(analyze(generate(120, seed=5).table)))
    assert 'id="kv-transfer"' not in plain and TITLE not in plain


def _render(summary, width: int) -> str:
    console = PlainConsole(width=width, file=io.StringIO(), force_terminal=False)
    render_analysis(summary, console)
    return console.file.getvalue()


def test_analyze_prints_the_transfer_table_within_80_columns(traces):
    summary = analyze(disaggregate(generate(120, seed=5).table)).summary
    text = _render(summary, 80)
    assert TITLE in text
    assert all(cell_len(line) <= 80 for line in text.splitlines())
    bw = summary.kv_transfer["bytes_per_s"]
    assert f"{rate_text(bw['p50'])} / {rate_text(bw['p90'])}" in text
    assert "120 measured transfers" in text
    assert TITLE not in _render(analyze(generate(120, seed=5).table).summary, 80)


def test_analyze_json_and_the_terminal_report_carry_the_transfer(traces):
    out = runner.invoke(app, ["analyze", traces["disagg"], "--json"])
    assert out.exit_code == 0, out.output
    kv = json.loads(out.stdout)["kv_transfer"]
    assert kv == analyze(disaggregate(generate(120, seed=5).table)).summary.kv_transfer
    assert kv["requests"] == 120 and kv["estimated"] == 0
    plain = runner.invoke(app, ["analyze", traces["colocated"], "--json"])
    assert "kv_transfer" not in json.loads(plain.stdout)
    report = runner.invoke(app, ["report", traces["disagg"]], env={"COLUMNS": "80"})
    assert report.exit_code == 0, report.output
    assert TITLE in report.stdout
    assert all(cell_len(line) <= 80 for line in report.stdout.splitlines())


def test_compare_puts_the_transfer_beside_the_colocated_stages(traces):
    a = analyze(generate(120, seed=5).table).attribution
    b = analyze(disaggregate(generate(120, seed=5).table)).attribution
    rows = compare(a, b, resamples=200, seed=0)
    kv = rows[(rows["condition"] == "all") & (rows["metric"] == "kv_transfer")]
    assert kv["percentile"].tolist() == [50, 90, 99]
    assert (kv["a_ms"] == 0).all()
    expected = np.percentile(b.attributed["kv_transfer"].to_numpy() / 1e6, [50, 90, 99])
    assert kv["b_ms"].to_numpy() == pytest.approx(expected)
    assert (kv["b_ms"] > 0).all()
    # The transfer replaces the co-located prefill envelope's gaps; TTFT is unchanged.
    ttft = rows[(rows["condition"] == "all") & (rows["metric"] == "ttft")]
    assert (ttft["delta_ms"] == 0).all()


def test_compare_header_says_which_side_is_disaggregated(traces):
    result = runner.invoke(app, ["compare", traces["colocated"], traces["disagg"],
                                 "--resamples", "200"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "A co-located  B disaggregated (first token: decode)" in result.stdout.splitlines()
    assert "kv_transfer" in result.stdout
    js = runner.invoke(app, ["compare", traces["colocated"], traces["disagg"], "--json",
                             "--resamples", "200"])
    rows = [r for r in json.loads(js.stdout)["rows"] if r["metric"] == "kv_transfer"]
    assert len(rows) == 3 * 3 and all(r["a_ms"] == 0 for r in rows)
    same = runner.invoke(app, ["compare", traces["colocated"], traces["colocated"],
                               "--resamples", "200"])
    assert "disaggregated" not in same.stdout and "co-located" not in same.stdout


def test_a_report_with_transfers_reads_right_at_900_px(traces):
    out = traces["folder"] / "disagg.html"
    result = runner.invoke(app, ["report", traces["disagg"], "-o", str(out)])
    assert result.exit_code == 0, result.output
    with page(900, 900) as pg:
        errors, refused = open_offline(pg, out)
        figures = pg.evaluate(LAYOUT)
        table_rows = pg.evaluate(
            "() => [...document.querySelectorAll('#kv-transfer tr')].length")
        lanes = pg.evaluate(
            """() => [...document.querySelectorAll('[id^=waterfall-] .ytick text')].map(e => {
                const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom];
            })""")
    assert errors == [] and refused == []
    assert table_rows == 7  # header and six figures
    waterfalls = [d for d in figures if d["id"].startswith("waterfall-")]
    assert len(waterfalls) == 3
    for d in waterfalls:
        assert len(d["labels"]) >= 2, d["id"]
        assert all(within(b, d) for b in d["titles"] + d["labels"] + d["legend"]), d["id"]
        assert overlapping(d["labels"]) == [], d["id"]
        assert overlapping(d["legend"] + d["xtitle"]) == [], d["id"]
    assert len(lanes) > 6 and overlapping(lanes) == []


def test_compare_of_datasets_on_dask_says_which_side_is_disaggregated(traces):
    pytest.importorskip("distributed")
    folder = traces["folder"]
    sets = []
    for name in ("colocated", "disagg"):
        out = folder / f"{name}.ds"
        made = runner.invoke(app, ["partition", traces[name], "-o", str(out),
                                   "--partitions", "2"])
        assert made.exit_code == 0, made.output
        sets.append(str(out))
    result = runner.invoke(app, ["compare", *sets, "--resamples", "200", "--workers", "1"],
                           env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "A co-located  B disaggregated (first token: decode)" in result.stdout.splitlines()


def test_the_report_says_where_the_first_token_came_from(traces, tmp_path):
    note = "deployment: disaggregated (first token: decode): TTFT includes the K/V transfer"
    text = runner.invoke(app, ["report", traces["disagg"]], env={"COLUMNS": "120"})
    assert text.exit_code == 0, text.output
    assert note in text.stdout.splitlines()
    page = tmp_path / "disagg.html"
    assert runner.invoke(app, ["report", traces["disagg"], "-o", str(page)]).exit_code == 0
    assert f'<div class="sub"><b>{note}</b></div>' in page.read_text()
    plain = runner.invoke(app, ["report", traces["colocated"]], env={"COLUMNS": "120"})
    assert "deployment:" not in plain.stdout


def test_a_prefill_side_first_token_is_named_too():
    meta = {"engine": {"disaggregated": {"first_token": "prefill"}}}
    assert deployment_note(meta) == (
        "deployment: disaggregated (first token: prefill): the K/V transfer follows the first "
        "token (it shows in the second token's time)")
    assert deployment_note({"engine": {"device": "cpu"}}) is None
    assert deployment_note({}) is None


@pytest.mark.parametrize("side", ["decode", "prefill"])
def test_a_trace_without_run_metadata_is_known_disaggregated_by_its_transfers(tmp_path, side):
    """``ttft serve --disaggregate --trace-out`` writes no run metadata: the deployment line
    comes from the ``kv_transfer`` spans and the side they name, in both reports."""
    path = write_trace(tmp_path / "served.parquet",
                       disaggregate(generate(60, seed=3).table, first_token=side), {})
    expected = deployment_note(METADATA_DISAGG if side == "decode" else {
        "engine": {"disaggregated": {"first_token": "prefill"}}})
    text = runner.invoke(app, ["report", str(path)], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[1] == expected  # the line under the title
    page = tmp_path / "served.html"
    assert runner.invoke(app, ["report", str(path), "-o", str(page)]).exit_code == 0
    assert f'<div class="sub"><b>{html.escape(expected)}</b></div>' in page.read_text()


def test_transfers_that_name_no_side_still_say_disaggregated():
    data = build_report(analyze(disaggregate(generate(60, seed=3).table, first_token=None)))
    n = data.summary.kv_transfer["requests"]
    assert data.notes == [f"deployment: disaggregated ({n:,} requests have a K/V transfer; "
                          "the trace does not record which side sent the first token)"]
    assert build_report(analyze(generate(60, seed=3).table)).notes == []


def test_the_deployment_line_reads_metadata_first_then_the_transfers():
    decode = {"requests": 4, "first_token": {"decode": 4}}
    mixed = {"requests": 4, "first_token": {"decode": 1, "prefill": 2}}
    assert deployment_note(METADATA_DISAGG, mixed) == deployment_note(METADATA_DISAGG)
    assert deployment_note({}, decode) == deployment_note(METADATA_DISAGG)
    assert deployment_note(METADATA_COLOCATED, decode) == deployment_note(METADATA_DISAGG)
    assert deployment_note({"engine": {"disaggregated": {}}}, decode) == deployment_note(
        METADATA_DISAGG)
    assert deployment_note({"engine": {"disaggregated": {}}}) == "deployment: disaggregated"
    assert deployment_note({}, mixed) == (
        "deployment: disaggregated (4 requests have a K/V transfer; first token: decode for "
        "1, prefill for 2)")
    assert deployment_note({}, None) is None
    assert deployment_note(METADATA_COLOCATED, None) is None
