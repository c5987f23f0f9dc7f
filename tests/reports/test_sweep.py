"""`ttft sweep` as a user types it, against the reference server on loopback exporting its
spans over real OTLP/HTTP to each step's receiver; `ttft report` of the sweep; the knee's
rule; the errors a user can act on."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace

import pyarrow.compute as pc
import pytest
from _browser import LAYOUT, open_offline, overlapping, page, within
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from rich.console import Console
from typer.testing import CliRunner

import ttft.tracer as tt
from ttft.analysis import analyze, percentile_bands
from ttft.collectors import read_spans, run_metadata
from ttft.collectors.trace_run import TraceSpec, build_workload
from ttft.engine.server import build_engine, free_port, serving
from ttft.reports.cli import app
from ttft.reports.html_report import plotly_js
from ttft.reports.runs.sweep import SweepSpec, knee_of, run_sweep
from ttft.reports.views.sweep import (
    GOODPUT_TITLE,
    STACK_TITLE,
    THROUGHPUT_TITLE,
    render_sweep,
    throughput_figure,
)

runner = CliRunner()
SLO = ["--slo", "ttft=40ms,e2e=2s"]
WORKLOAD = ["--requests", "6", "--prompt-tokens", "24:48", "--output-tokens", "3",
            "--warmup", "0", "--span-wait", "5"]


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("tokenizer"))
    return lambda: build_engine("tiny", device="cpu", tokenizer_cache_dir=cache)


@pytest.fixture(scope="module")
def server(engine_factory):
    """``(url, receiver port)``: the reference server exporting its spans to that port,
    where each step's receiver listens in turn."""
    port = free_port()
    tracing = tt.configure("ttft-server", [OTLPSpanExporter(
        endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=2)], flush_interval_s=0.05)
    try:
        with serving(engine_factory(), model_name="tiny") as url:
            yield url, port
    finally:
        tracing.shutdown()


@pytest.fixture(scope="module")
def swept(server, tmp_path_factory):
    """One three-step rate sweep with SLOs, printed as JSON."""
    url, port = server
    out = tmp_path_factory.mktemp("sweep") / "run"
    result = runner.invoke(app, ["sweep", url, "--rates", "16,4,8", *WORKLOAD, *SLO,
                                 "--receiver-port", str(port), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout), result.stderr


def test_the_sweep_writes_one_trace_per_level_and_its_summary(swept):
    out, printed, stderr = swept
    assert printed == json.loads((out / "sweep.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == [
        "step-01-rate-4.parquet", "step-02-rate-8.parquet", "step-03-rate-16.parquet",
        "sweep.json"]
    assert printed["levels"] == [4.0, 8.0, 16.0] and printed["finished"]
    assert printed["stopped"] is None and printed["slo"] == {"ttft": 40.0, "e2e": 2000.0}
    assert [s["status"] for s in printed["steps"]] == ["ok"] * 3
    assert [s["sent"] for s in printed["steps"]] == [6] * 3
    for step in printed["steps"]:
        assert run_metadata(read_spans(out / step["trace"]))["arguments"]["rate"] == step["level"]
        assert f"rate {step['level']:g} req/s" in stderr  # each step's header and row


def test_each_steps_figures_are_what_ttft_analyze_says_of_its_trace(swept):
    out, printed, _ = swept
    for step in printed["steps"]:
        result = runner.invoke(app, ["analyze", str(out / step["trace"]), "--json", *SLO])
        assert result.exit_code == 0, result.output
        found = json.loads(result.stdout)
        assert step["boundary"] == found["boundary"] == "client"
        assert step["ttft_ms"] == {"p50": found["ttft_ms"]["p50"], "p99": found["ttft_ms"]["p99"]}
        assert step["throughput"] == {k: found["load"][k] for k in (
            "duration_s", "requests_per_s", "output_tokens_per_s")}
        assert step["goodput"] == {k: found["goodput"][k] for k in ("share", "requests", "per_s")}
        failed = sum(found["failures"].values())
        assert step["failures"] == {"count": failed, "rate": failed / found["requests"],
                                    "by_kind": found["failures"]}
        assert step["stack"]["mean"] == {s: v["mean"] for s, v in found["stages"].items()}
        assert step["stack"]["share"] == {s: v["share"] for s, v in found["stages"].items()}
        bands = percentile_bands(analyze(read_spans(out / step["trace"])).attribution)
        assert step["stack"]["p50_ttft_ms"] == bands.loc["p50", "ttft_ms"]
        assert sum(step["stack"]["p50"].values()) == pytest.approx(step["stack"]["p50_ttft_ms"])
        assert {"queue", "prefill.chunk", "network"} <= set(step["stack"]["p50"])


def test_the_knee_is_the_last_level_before_the_first_missing_the_goodput_target(swept):
    _, printed, _ = swept
    expected = None
    for step in printed["steps"]:
        meets = step["goodput"]["share"] >= printed["goodput_target"]
        assert step["meets_slo"] is meets
        if not meets:
            break
        expected = step["level"]
    assert printed["knee"]["level"] == expected


def _steps(*shares):
    return [{"level": float(i + 1), "status": "ok" if share is not None else "failed",
             "goodput": None if share is None else {"share": share}}
            for i, share in enumerate(shares)]


@pytest.mark.parametrize(("shares", "knee"), [
    ((1.0, 0.95, 0.9), 3.0),  # every level meets: the highest
    ((1.0, 0.95, 0.5, 0.99), 2.0),  # a later recovery does not move the knee past a miss
    ((0.5, 1.0), None),  # the lowest misses
    ((1.0, None), 1.0),  # a failed step misses
])
def test_knee_rule(shares, knee):
    steps = _steps(*shares)
    found = knee_of(steps, {"ttft": 100.0}, 0.9)
    assert found["level"] == knee and found["reason"]
    assert [s["meets_slo"] for s in steps] == [s is not None and s >= 0.9 for s in shares]


def test_without_an_slo_there_is_no_knee():
    steps = _steps(1.0, 1.0)
    assert knee_of(steps, None, 0.9) == {"level": None, "reason": "no --slo given: no knee"}
    assert [s["meets_slo"] for s in steps] == [None, None]


def _cached_tokens(trace) -> list[int]:
    table = read_spans(trace)
    clients = table.filter(pc.equal(table.column("stage"), "client"))
    return [json.loads(a)["cached_tokens"] for a in clients.column("attributes").to_pylist()]


def test_every_step_sends_fresh_prompts_so_none_is_a_prefix_cache_hit(swept):
    out, printed, _ = swept
    seeds = [s["seed"] for s in printed["steps"]]
    assert len(set(seeds)) == 3 and printed["base_seed"] not in seeds
    workload = TraceSpec(url="http://x", rate=1.0, requests=6, prompt_tokens=(24, 48),
                         output_tokens=3)
    prompts = [{item.prompt for item in build_workload(replace(workload, seed=seed))}
               for seed in seeds]
    assert not (prompts[0] & prompts[1]) and not (prompts[1] & prompts[2])
    for step in printed["steps"]:
        assert run_metadata(read_spans(out / step["trace"]))["arguments"]["seed"] == step["seed"]
        assert _cached_tokens(out / step["trace"]) == [0] * 6
        assert step["cached_requests"] == 0


def test_same_prompts_repeat_the_first_steps_prompts(server, tmp_path):
    url, port = server
    out = tmp_path / "same"
    result = runner.invoke(app, [
        "sweep", url, "--concurrency", "1,2", "--requests", "3", "--prompt-tokens", "40",
        "--output-tokens", "2", "--warmup", "0", "--span-wait", "5", "--same-prompts",
        "--receiver-port", str(port), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    first, second = printed["steps"]
    assert first["seed"] == second["seed"] == printed["base_seed"]
    assert _cached_tokens(out / first["trace"]) == [0, 0, 0]
    assert all(n > 0 for n in _cached_tokens(out / second["trace"]))
    assert printed["knee"] == {"level": None, "reason": "no --slo given: no knee"}
    assert [p.name for p in sorted(out.glob("step-*"))] == [
        "step-01-concurrency-1.parquet", "step-02-concurrency-2.parquet"]


def test_report_of_a_sweep_in_the_terminal_and_as_html(swept, tmp_path):
    out, printed, _ = swept
    result = runner.invoke(app, ["report", str(out)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert all(len(line) <= 80 for line in text.splitlines()) and "…" not in text
    assert "rate 4, 8, 16 (req/s)" in text and "where ttft goes as load rises" in text
    assert {"queue", "prefill.chunk", "network"} <= set(text.replace(",", " ").split())
    knee = printed["knee"]["level"]
    assert ("knee: none" if knee is None else f"knee: rate {knee:g} req/s") in text
    page_path = tmp_path / "sweep.html"
    result = runner.invoke(app, ["report", str(out), "-o", str(page_path)])
    assert result.exit_code == 0, result.output
    page = page_path.read_text()
    assert page.count(plotly_js()) == 1
    assert page.count('class="plotly-graph-div"') == 3
    for title in (STACK_TITLE, THROUGHPUT_TITLE, GOODPUT_TITLE):
        assert json.dumps(title) in page  # a chart's title, in its figure JSON
    # the settings fold under one line saying the workload per step
    assert ('<details class="fold" id="settings-fold"><summary>6 requests per step; 24–48 '
            "prompt tokens; 3 output tokens; ") in page


def test_a_step_that_fails_outright_stops_the_sweep_and_keeps_the_earlier_ones(
        engine_factory, tmp_path):
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(serving(engine_factory(), model_name="tiny"))

        @contextlib.contextmanager
        def server_goes_down_at_step_two(index, level):
            if index == 1:
                stack.close()
            yield {}

        workload = TraceSpec(url=url, requests=3, prompt_tokens=(24, 24), output_tokens=2,
                             warmup=0, receiver_port=0, span_wait_s=0.2)
        content = run_sweep(SweepSpec(workload, "rate", (4.0, 8.0, 16.0)), tmp_path / "s",
                            step_display=server_goes_down_at_step_two)
    first, second = content["steps"]
    assert first["status"] == "ok" and first["sent"] == 3
    assert second["status"] == "failed" and "cannot reach the server" in second["error"]
    assert second["trace"] is None and second["ttft_ms"] is None
    assert content["stopped"].startswith("step 2 (rate 8) failed: ")
    assert json.loads((tmp_path / "s" / "sweep.json").read_text()) == json.loads(
        json.dumps(content))
    assert (tmp_path / "s" / first["trace"]).is_file()
    console = Console(width=80, record=True, file=io.StringIO())
    render_sweep(content, console)
    text = console.export_text()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    assert "step 2 failed: http://" in text and "stopped early: step 2 (rate 8)" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--rates", "1,2", "--concurrency", "1"], "give exactly one of --rates or --concurrency"),
    ([], "give exactly one of --rates or --concurrency"),
    (["--rates", "1,fast"], "--rates level 'fast': expected a positive number"),
    (["--rates", "0,1"], "--rates level '0': expected a positive number"),
    (["--concurrency", "2,-1"], "--concurrency level '-1': expected a positive whole number"),
    (["--concurrency", "1.5"], "--concurrency level '1.5': expected a positive whole number"),
])
def test_bad_levels_are_one_line_errors(args, message, tmp_path):
    result = runner.invoke(app, ["sweep", "http://127.0.0.1:9", *args, "--requests", "2",
                                 "-o", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"error: {message} (as in 1,2,4,8)"
                                                  if "level" in message
                                                  else f"error: {message} (e.g. --rates "
                                                  "1,2,4,8)"]
    assert not (tmp_path / "s").exists()


def test_an_unreachable_server_is_an_error_before_any_step(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["sweep", url, "--rates", "1,2", "--requests", "2",
                                 "-o", str(tmp_path / "s")])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {url}: cannot reach the server")
    assert not (tmp_path / "s").exists()


def test_a_directory_that_is_not_a_sweep_is_left_alone(server, tmp_path):
    url, _ = server
    (tmp_path / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["sweep", url, "--rates", "1", "--requests", "2",
                                 "-o", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: {tmp_path}: a non-empty directory that is not "
                                     "a sweep (no sweep.json); choose a new or empty directory")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_report_of_a_directory_with_a_foreign_sweep_json_is_an_error(tmp_path):
    (tmp_path / "sweep.json").write_text('{"kind": "something else"}')
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: {tmp_path / 'sweep.json'}: not a ttft sweep "
                                     'summary (no "kind": "ttft sweep")')


@pytest.mark.parametrize("width", [1400, 900])
def test_the_sweep_page_reads_right_in_chromium(swept, tmp_path, width):
    """No JS error; three figures, each title, legend and label inside its figure, tick
    labels and legend clear of each other."""
    out, _, _ = swept
    page_path = tmp_path / "sweep.html"
    assert runner.invoke(app, ["report", str(out), "-o", str(page_path)]).exit_code == 0
    with page(width, 900) as pg:
        errors, refused = open_offline(pg, page_path)
        shot = tmp_path / f"sweep-{width}.png"
        pg.screenshot(path=str(shot), full_page=True)
        print(f"screenshot {width} px: {shot}")
        figures = pg.evaluate(LAYOUT)
    assert errors == [] and refused == []
    assert len(figures) == 3
    for d in figures:
        where = (width, d["id"])
        assert d["titles"] and d["legend"], where
        assert all(within(b, d) for b in d["titles"] + d["labels"] + d["legend"]), where
        assert overlapping([t[1:] for t in d["ticks"]]) == [], where
        assert overlapping(d["legend"] + d["xtitle"]) == [], where


def test_requests_and_output_tokens_per_s_are_drawn_in_panels_of_their_own():
    """At a fixed output length tokens/s is 16 × requests/s: on one plot with an axis each
    the two lines would coincide, so each has its own panel, axis and unit."""
    rates = [1.0, 1.9, 2.6]
    steps = [{"level": level, "throughput": {"requests_per_s": r, "output_tokens_per_s": 16 * r},
              "goodput": {"per_s": r / 2}} for level, r in zip((1, 2, 4), rates, strict=True)]
    fig = throughput_figure({"steps": steps, "slo": {"ttft": 40.0}, "mode": "rate",
                             "knee": {"level": 2}})
    axis_of = {t.name: t.yaxis or "y" for t in fig.data}
    assert axis_of == {"completed requests/s": "y", "requests/s meeting the SLO": "y",
                       "output tokens/s (lower panel)": "y2"}
    assert [list(t.y) for t in fig.data] == [rates, [r / 2 for r in rates],
                                             [16 * r for r in rates]]
    upper, lower = fig.layout.yaxis, fig.layout.yaxis2
    assert (upper.title.text, lower.title.text) == ("requests/s", "output tokens/s")
    assert lower.overlaying is None and lower.domain[1] < upper.domain[0]  # apart, not over
    assert fig.layout.xaxis.anchor == "y2"  # one level axis, under the lower panel
