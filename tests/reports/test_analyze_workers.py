"""``ttft analyze DATASET --workers N | --scheduler ADDRESS``: a real Dask cluster gives
exactly the one-process summary and per-request parts (issue 17).

The commands run as subprocesses: a ``LocalCluster`` spawns worker processes, which
cannot start from inside a CliRunner call."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest

pytest.importorskip("distributed")

PARTITIONS = 6
TIMEOUT_S = 120


def ttft(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ttft.reports.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def ok(*args: str) -> str:
    result = ttft(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def summary(stdout: str) -> dict:
    out = json.loads(stdout)
    out.pop("trace")
    return out


def sorted_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["trace_id", "stage"], kind="stable").reset_index(drop=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``(trace, dataset)``: 1,500 synthetic requests and the trace in 6 partitions."""
    root = tmp_path_factory.mktemp("workers")
    trace, dataset = root / "t.parquet", root / "ds"
    ok("synth", "-o", trace, "--requests", 1500, "--seed", 5)
    ok("partition", trace, "-o", dataset, "--partitions", PARTITIONS)
    return trace, dataset


@pytest.fixture(scope="module")
def scheduler():
    from distributed import LocalCluster

    # the scheduler's HTTP server (metrics) binds 8787 even without a dashboard, and warns
    # when another cluster holds it: a free port on the loopback instead
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster:
        yield cluster.scheduler_address


def test_workers_print_exactly_the_one_process_summary(data):
    trace, dataset = data
    result = ttft("analyze", dataset, "--json", "--workers", 2)
    assert result.returncode == 0, result.stderr
    assert f"analysed {PARTITIONS} partitions on 2 Dask workers" in result.stderr
    single = ok("analyze", dataset, "--json")
    assert result.stdout == single
    assert summary(result.stdout) == summary(ok("analyze", trace, "--json"))


@pytest.mark.parametrize(("boundary", "policy"), [("client", "critical-path"),
                                                  ("engine", "shared")])
def test_a_running_scheduler_gives_the_one_process_summary_and_parts(data, scheduler,
                                                                     tmp_path, boundary,
                                                                     policy):
    _, dataset = data
    options = ["--boundary", boundary, "--policy", policy]
    parts = tmp_path / "parts"
    distributed = ok("analyze", dataset, "--json", *options, "--scheduler", scheduler,
                     "--per-request", parts)
    single_file = tmp_path / "single.parquet"
    single = ok("analyze", dataset, "--json", *options, "--per-request", single_file)
    assert distributed == single
    assert json.loads(single)["boundary"] == boundary
    files = sorted(p.name for p in parts.iterdir())
    assert files == sorted(f"part={k}.parquet" for k in range(PARTITIONS))
    frames = [pq.read_table(parts / name).to_pandas() for name in files]
    assert all(len(frame) for frame in frames)
    union = pd.concat(frames, ignore_index=True)
    pd.testing.assert_frame_equal(sorted_rows(union),
                                  sorted_rows(pq.read_table(single_file).to_pandas()))


def test_slos_on_a_scheduler_give_the_one_process_goodput_and_stage_rescue(data, scheduler):
    _, dataset = data
    slo = ["--slo", "ttft=300ms,e2e=600ms"]
    distributed = ok("analyze", dataset, "--json", *slo, "--scheduler", scheduler)
    assert distributed == ok("analyze", dataset, "--json", *slo)
    good = json.loads(distributed)["goodput"]
    assert good["ttft_stages"]["slo_ms"] == 300 and good["ttft_stages"]["missing"] > 0


def test_workers_on_a_plain_trace_is_refused_in_one_line(data):
    trace, _ = data
    result = ttft("analyze", trace, "--workers", 2)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "not a partitioned dataset" in lines[0] and "ttft partition" in lines[0]
    assert result.stdout == ""


def test_regime_with_workers_is_refused(data):
    _, dataset = data
    result = ttft("analyze", dataset, "--regime", "--workers", 2)
    assert result.returncode == 2
    assert "--regime" in result.stderr and "Traceback" not in result.stderr
