"""The command line as a user types it: synth, analyze, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ttft.collectors import read_spans, write_trace
from ttft.collectors.synthetic import expected_path
from ttft.reports.cli import app
from ttft.tracer.schema import METADATA_KEY, SPAN_SCHEMA

runner = CliRunner()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "demo.parquet"
    result = runner.invoke(
        app, ["synth", "--requests", "300", "--seed", "5", "-o", str(path), "--expected"]
    )
    assert result.exit_code == 0, result.output
    return path


def ttft_script() -> str:
    """The installed console script, beside this interpreter (PATH may not include it)."""
    beside = Path(sys.executable).parent / "ttft"
    return str(beside) if beside.exists() else (shutil.which("ttft") or "ttft")


def test_console_script_runs_the_readme_line(tmp_path):
    env = {**os.environ, "COLUMNS": "120"}
    subprocess.run(
        [ttft_script(), "synth", "-o", "demo.parquet", "--requests", "50"],
        cwd=tmp_path,
        check=True,
        env=env,
        capture_output=True,
    )
    done = subprocess.run(
        [ttft_script(), "analyze", "demo.parquet"],
        cwd=tmp_path,
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "boundary=client" in done.stdout
    assert "requests=50" in done.stdout
    assert "data quality: no defects found" in done.stdout


def test_analyze_json_shape_and_values(trace):
    result = runner.invoke(app, ["analyze", str(trace), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert list(out) == [
        "trace",
        "schema_version",
        "boundary",
        "policy",
        "requests",
        "requests_ok",
        "failures",
        "failure_examples",
        "failed_first_token",
        "ttft_ms",
        "stages",
        "conditions",
        "itl_ms",
        "tpot_ms",
        "chunk_gap_ms",
        "ttst_ms",
        "ttfrt_ms",
        "tail",
        "quality",
        "load",
    ]
    assert (out["boundary"], out["policy"], out["requests"]) == ("client", "exclusive", 300)
    assert (out["requests_ok"], out["failures"], out["failed_first_token"]) == (300, {}, None)
    assert out["trace"] == str(trace)
    assert set(out["conditions"]) == {"cold", "prefix_hit"}
    assert sum(c["requests"] for c in out["conditions"].values()) == 300
    assert sum(s["share"] for s in out["stages"].values()) == pytest.approx(1.0)
    assert out["stages"]["gpu"]["overlap_mean"] == 0.0
    assert out["stages"]["prefill"]["overlap_mean"] > 0
    assert set(out["itl_ms"]) == {"p50", "p90", "p99", "mean", "requests"}
    assert out["itl_ms"]["requests"] == 300 and out["ttfrt_ms"] is None
    assert all(v == 0 for v in out["quality"].values())


def test_analyze_json_with_slo_carries_load_and_goodput(trace):
    result = runner.invoke(app, ["analyze", str(trace), "--json", "--slo", "ttft=0.5s,tpot=50ms"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert list(out)[-2:] == ["load", "goodput"]
    load, good = out["load"], out["goodput"]
    assert set(load) == {"duration_s", "requests", "requests_per_s", "output_tokens",
                         "output_tokens_per_s", "e2e_ms", "content_filter"}
    assert load["requests"] == 300 and load["e2e_ms"]["requests"] == 300
    assert load["requests_per_s"] == load["requests"] / load["duration_s"]
    assert good["slo"] == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert good["share"] == good["requests"] / 300
    assert good["per_s"] == good["requests"] / load["duration_s"]
    printed = runner.invoke(app, ["analyze", str(trace), "--slo", "ttft=500ms"])
    assert printed.exit_code == 0, printed.output
    assert "load: 300 requests completed in" in printed.stdout
    assert "meet ttft ≤ 500 ms" in printed.stdout


def test_slo_with_workers_on_a_plain_trace_is_refused_before_any_work(trace):
    result = runner.invoke(app, ["analyze", str(trace), "--workers", "2", "--slo", "ttft=1s"])
    assert result.exit_code == 2
    assert "not a partitioned dataset" in " ".join(result.output.split())


@pytest.mark.parametrize(("slo", "named"), [
    ("ttft=500", "'ttft=500'"), ("latency=5ms", "'latency=5ms'"), ("ttft=-1s", "'ttft=-1s'"),
    ("ttft=5ms,tpot", "'tpot'"), ("ttft=1ms,ttft=2ms", "ttft is given twice"),
])
def test_a_bad_slo_names_the_bad_part_and_exits_2(trace, slo, named):
    result = runner.invoke(app, ["analyze", str(trace), "--slo", slo])
    assert result.exit_code == 2
    assert named in " ".join(result.output.split())


@pytest.mark.parametrize("policy", ["exclusive", "shared", "critical-path"])
@pytest.mark.parametrize("boundary", ["client", "server", "engine"])
def test_per_request_output_equals_the_generators_expectation(trace, tmp_path, boundary, policy):
    out = tmp_path / "per.parquet"
    result = runner.invoke(
        app,
        [
            "analyze",
            str(trace),
            "--boundary",
            boundary,
            "--policy",
            policy,
            "--json",
            "--per-request",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    got = pq.read_table(out).to_pandas()
    assert list(got.columns) == [
        "trace_id",
        "request_id",
        "condition",
        "stage",
        "attributed_ns",
        "covered_ns",
        "raw_ns",
        "ttft_ns",
    ]
    got = got[got.attributed_ns > 0].set_index(["trace_id", "stage"])["attributed_ns"]
    exp = pd.read_parquet(expected_path(trace))
    exp = exp[(exp.boundary == boundary) & (exp.policy == policy)]
    exp = exp.set_index(["trace_id", "stage"])["attributed_ns"]
    assert got.sort_index().to_dict() == exp.sort_index().to_dict()


def test_missing_and_corrupt_files_give_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "nope.parquet"
    result = runner.invoke(app, ["analyze", str(missing)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {missing}: does not exist"
    corrupt = tmp_path / "bad.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet")
    done = subprocess.run(
        [sys.executable, "-m", "ttft.reports.cli", "analyze", str(corrupt)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {corrupt}: not a readable Parquet")


def test_not_a_ttft_trace_names_the_file(tmp_path):
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), other)
    result = runner.invoke(app, ["analyze", str(other)])
    assert result.exit_code == 2
    assert str(other) in result.stderr and "not a ttft trace" in result.stderr


def test_malformed_rows_are_counted_not_fatal(trace, tmp_path):
    table = read_spans(trace)
    starts = table.column("start_ns").to_pylist()
    ends = table.column("end_ns").to_pylist()
    ends[0] = starts[0] - 5  # one span now ends before it starts
    table = table.set_column(7, "end_ns", pa.array(ends, pa.int64()))
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: b'{"schema_version": 1}'}), bad)
    result = runner.invoke(app, ["analyze", str(bad), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["quality"]["end_before_start"] == 1
    assert out["requests"] >= 299


def test_empty_trace_reports_no_requests(tmp_path):
    empty = tmp_path / "empty.parquet"
    write_trace(empty, SPAN_SCHEMA.empty_table())
    result = runner.invoke(app, ["analyze", str(empty)])
    assert result.exit_code == 0, result.output
    assert "No request has a TTFT window" in result.stdout


def test_analyze_reads_a_directory_of_parts(trace, tmp_path):
    from ttft.collectors import TraceWriter

    table = read_spans(trace)
    target = tmp_path / "run.parquet"
    writer = TraceWriter(target, flush_spans=2_000, merge_on_close=False)
    for batch in table.to_batches(max_chunksize=1_500):
        writer.append(batch)
    writer.close()
    parts = tmp_path / "run.parquet.parts"
    assert len(list(parts.glob("part-*.parquet"))) > 1
    whole = json.loads(runner.invoke(app, ["analyze", str(trace), "--json"]).stdout)
    split = json.loads(runner.invoke(app, ["analyze", str(parts), "--json"]).stdout)
    assert split["stages"] == whole["stages"] and split["requests"] == 300


def test_analyze_never_imports_torch(trace):
    """Nor numba, for a trace this small: no kernel runs, and none is warmed up."""
    code = (
        "import sys\n"
        "from ttft.reports.cli import main\n"
        f"sys.argv = ['ttft', 'analyze', {str(trace)!r}, '--json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'numba' not in sys.modules, 'numba was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["requests"] == 300
