"""``ttft compare A B`` on real trace files: the table, JSON, the regression gate, errors."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _traces import scaled
from typer.testing import CliRunner

from ttft.collectors import write_trace
from ttft.collectors.synthetic import generate
from ttft.reports.cli import app

runner = CliRunner()
FAST = ["--resamples", "300"]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compare")
    synthetic = generate(1500, seed=3)
    table, metadata = synthetic.table, synthetic.metadata
    clock = table.column("clock").cast(pa.string())
    name = table.column("name")
    stage = table.column("stage").cast(pa.string())
    client_only = table.filter(pc.equal(clock, "client"))
    engine_only = table.filter(
        pc.and_(
            pc.and_(pc.not_equal(clock, "client"), pc.not_equal(stage, "server")),
            pc.not_equal(name, "first_byte"),
        )
    )
    paths = {}
    for key, t in {
        "a": table,
        "slow": scaled(table, 6, 5),
        "fast": scaled(table, 4, 5),
        "client_only": client_only,
        "engine_only": engine_only,
    }.items():
        paths[key] = str(write_trace(folder / f"{key}.parquet", t, metadata))
    return paths


def test_table_has_the_ttft_rows(traces):
    result = runner.invoke(app, ["compare", traces["a"], traces["slow"], *FAST])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"A {traces['a']}" in out and f"B {traces['slow']}" in out
    assert "boundary=client  policy=exclusive  requests A=1,500 B=1,500" in out
    assert "all requests (mixes cold and prefix_hit): A 1,500 · B 1,500 requests" in out
    assert "cold: A 1,055 · B 1,055 requests" in out
    assert "prefix_hit: A 445 · B 445 requests" in out
    ttft = [line for line in out.splitlines() if "TTFT" in line and "│" in line]
    assert len(ttft) == 9
    assert all("+20.0%" in line and "worse" in line for line in ttft)
    assert "│ queue" in out and "│ gpu" in out
    assert "│ unattributed" not in out  # no time on either side
    assert max(len(line) for line in out.splitlines()) <= 140
    assert result.stderr == ""  # no regression gate asked for


def test_json(traces):
    result = runner.invoke(
        app, ["compare", traces["a"], traces["slow"], "--json", *FAST, "--seed", "3"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert list(out) == ["a", "b", "boundary", "policy", "resamples", "seed", "rows", "failures",
                         "slo", "load", "no_window"]
    assert out["no_window"] == {"a": 0, "b": 0}
    assert out["slo"] is None
    assert [r["metric"] for r in out["load"]] == [
        "requests_per_s", "output_tokens_per_s", "e2e_p50", "e2e_p99"]
    assert [(f["condition"], f["a_failed"], f["b_failed"]) for f in out["failures"]] == [
        ("all", 0, 0), ("cold", 0, 0), ("prefix_hit", 0, 0)]
    assert (out["a"], out["b"]) == (traces["a"], traces["slow"])
    assert (out["boundary"], out["policy"], out["resamples"], out["seed"]) == (
        "client",
        "exclusive",
        300,
        3,
    )
    first = out["rows"][0]
    assert list(first) == [
        "condition",
        "metric",
        "percentile",
        "a_ms",
        "b_ms",
        "delta_ms",
        "delta_pct",
        "ci_lo_ms",
        "ci_hi_ms",
        "significant",
        "a_requests",
        "b_requests",
    ]
    assert (first["condition"], first["metric"], first["percentile"]) == ("all", "ttft", 50)
    assert math.isclose(first["delta_pct"], 20.0, abs_tol=0.5)
    assert first["significant"] is True and first["a_requests"] == 1500
    # connect p50 is 0 on both sides: its percentage is null, not NaN.
    connect = [r for r in out["rows"] if r["metric"] == "connect" and r["percentile"] == 50]
    assert connect and all(r["delta_pct"] is None for r in connect)


def test_slo_gives_both_traces_goodput_and_the_delta(traces):
    args = ["compare", traces["a"], traces["slow"], *FAST, "--slo", "ttft=300ms"]
    out = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert out["slo"] == {"ttft_ms": 300.0}
    rows = {r["metric"]: r for r in out["load"]}
    share = rows["goodput_share"]
    assert share["b"] < share["a"]  # B is the slowed-down trace
    assert share["delta"] == share["b"] - share["a"]
    assert set(rows) >= {"requests_per_s", "goodput_per_s", "e2e_p99"}
    printed = runner.invoke(app, args)
    assert printed.exit_code == 0, printed.output
    assert "load (goodput: meeting ttft ≤ 300 ms)" in printed.stdout
    assert "goodput share" in printed.stdout


def test_gate_fails_on_a_regression_above_the_threshold(traces):
    result = runner.invoke(
        app, ["compare", traces["a"], traces["slow"], *FAST, "--max-regression", "10"]
    )
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 6
    assert lines[1].startswith("TTFT p99 (all) +20.0% [CI +")
    assert lines[1].endswith(" ms] exceeds 10%")
    assert [line.split(" (")[0] for line in lines] == ["TTFT p50", "TTFT p99"] * 3
    assert "TTFT" in result.stdout  # the table is printed before the verdict


def test_gate_passes_below_the_threshold_and_on_an_improvement(traces):
    result = runner.invoke(
        app, ["compare", traces["a"], traces["slow"], *FAST, "--max-regression", "30"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == "no significant regression over 30%"
    result = runner.invoke(
        app, ["compare", traces["a"], traces["fast"], *FAST, "--max-regression", "10", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == "no significant regression over 10%"
    rows = json.loads(result.stdout)["rows"]
    assert math.isclose(rows[0]["delta_pct"], -20.0, abs_tol=0.5)


def test_missing_file_exits_2_naming_it(traces, tmp_path):
    missing = tmp_path / "nope.parquet"
    result = runner.invoke(app, ["compare", traces["a"], str(missing)])
    assert result.exit_code == 2
    assert str(missing) in result.stderr and "error:" in result.stderr
    assert "Traceback" not in result.output


def test_default_boundary_is_the_outermost_both_support(traces):
    result = runner.invoke(app, ["compare", traces["a"], traces["engine_only"], *FAST])
    assert result.exit_code == 0, result.output
    assert "boundary=engine" in result.stdout


def test_no_common_boundary_exits_2(traces):
    result = runner.invoke(app, ["compare", traces["client_only"], traces["engine_only"]])
    assert result.exit_code == 2
    assert "share no TTFT boundary" in result.stderr
    assert f"{traces['client_only']} supports client" in result.stderr
    assert f"{traces['engine_only']} supports engine" in result.stderr


def test_boundary_one_trace_lacks_exits_2(traces):
    result = runner.invoke(
        app, ["compare", traces["a"], traces["engine_only"], "--boundary", "client"]
    )
    assert result.exit_code == 2
    assert f"{traces['engine_only']}: no request has a TTFT window at the client boundary" in (
        result.stderr
    )
