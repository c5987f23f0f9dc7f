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
    parts = tmp_path / "parts.parquet"
    distributed = ok("analyze", dataset, "--json", *options, "--scheduler", scheduler,
                     "--per-request", parts)
    single_file = tmp_path / "single.parquet"
    single = ok("analyze", dataset, "--json", *options, "--per-request", single_file)
    assert distributed == single
    assert json.loads(single)["boundary"] == boundary
    # one file either way, with the same rows in the same order
    got, want = (pq.read_table(p).to_pandas() for p in (parts, single_file))
    assert len(got) > 1500
    pd.testing.assert_frame_equal(got, want)


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


MAPPING = '[[rule]]\nstage = "queue"\nname = "no_such_span"\n'
MODEL = {"n_layer": 4, "d_model": 512, "n_head": 8, "n_kv_head": 4, "d_ff": 1536,
         "vocab_size": 32000, "dtype": "bfloat16"}
NOT_ANALYSIS = {"workers", "scheduler", "as_json", "out", "resamples", "seed", "floor_ms",
                "floor_pct", "all_rows", "max_regression"}
"""Options that choose where the analysis runs or how its result is shown, not what it is."""


def runs(tmp_path) -> dict[str, list[list]]:
    """Per command, the option lists run both ways: together they name every option of
    the command that changes its analysis."""
    mapping, model = tmp_path / "rules.toml", tmp_path / "model.json"
    mapping.write_text(MAPPING)
    model.write_text(json.dumps(MODEL))
    common = ["--boundary", "server", "--policy", "shared", "--format", "ttft",
              "--mapping", mapping, "--slo", "ttft=300ms,e2e=900ms"]
    regime = ["--regime", "--model-config", model, "--peak-tflops", 100,
              "--peak-bandwidth-gbs", 2000]
    return {
        "analyze": [[*common, *regime, "--json", "--per-request", tmp_path / "PER.parquet"],
                    [*regime]],
        "report": [[*common, "--model-config", model, "--peak-tflops", 100,
                    "--peak-bandwidth-gbs", 2000]],
        "compare": [[*common, "--json", "--resamples", 50]],
    }


def test_every_option_of_every_command_gives_one_answer_both_ways(data, scheduler, tmp_path):
    """A feature cannot exist on one side only: each command's every option that changes
    the analysis is run in one process and on the cluster, with one answer."""
    import typer.main

    from ttft.reports.cli import app

    _, dataset = data
    commands = {c.name or c.callback.__name__: c for c in app.registered_commands}
    for command, option_lists in runs(tmp_path).items():
        params = typer.main.get_command(app).commands[command].params
        named = {p.name for p in params if p.param_type_name == "option"} - NOT_ANALYSIS
        used = {p.name for p in params for args in option_lists for arg in args
                if isinstance(arg, str) and arg in p.opts}
        assert named <= used, f"{command}: options never run both ways: {named - used}"
        assert command in commands
        traces = [dataset, dataset] if command == "compare" else [dataset]
        for args in option_lists:
            here = [a if not str(a).endswith("PER.parquet") else tmp_path / "one.parquet"
                    for a in args]
            there = [a if not str(a).endswith("PER.parquet") else tmp_path / "two.parquet"
                     for a in args]
            want = ok(command, *traces, *here)
            got = ok(command, *traces, *there, "--scheduler", scheduler)
            assert got == want, (command, args)
            assert want.strip()
    assert (pq.read_table(tmp_path / "one.parquet").equals(
        pq.read_table(tmp_path / "two.parquet")))


def test_a_local_cluster_s_workers_keep_glibc_s_own_mmap_threshold(monkeypatch):
    """``local_cluster`` (``--workers N``) unsets the Dask nanny's
    ``MALLOC_TRIM_THRESHOLD_`` for its workers (docs/architecture.md, "Workers' memory"),
    even after a cluster with Dask's defaults wrote it into this process's environment (a
    nanny does, before it spawns), which is left as it was; that cluster's worker has it:
    the default is Dask's, not this machine's."""
    import os

    from distributed import Client, LocalCluster

    from ttft.reports.runs.runners import local_cluster

    def environ() -> str | None:
        return os.environ.get("MALLOC_TRIM_THRESHOLD_")

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)  # put back after the test
    with LocalCluster(n_workers=1, processes=True, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None) as theirs, Client(theirs) as client:
        assert list(client.run(environ).values()) == ["65536"]
    assert environ() == "65536"  # the nanny wrote it here
    with local_cluster(1, dashboard_address=None) as ours, Client(ours) as client:
        assert list(client.run(environ).values()) == [None]
    assert environ() == "65536"


def test_a_local_cluster_s_workers_keep_arrow_s_default_pool(monkeypatch):
    """The Arrow pool a command chose for its own process (``reports.arrow_pool``) is not
    handed to the workers of a cluster it starts: a worker reuses Arrow's default better
    (docs/architecture.md, "Arrow's memory pool"); the command's own setting stays."""
    import os

    from distributed import Client

    from ttft.reports import arrow_pool
    from ttft.reports.runs.runners import local_cluster

    def pool() -> tuple[str | None, str]:
        import pyarrow as pa

        return os.environ.get(arrow_pool.VARIABLE), pa.default_memory_pool().backend_name

    monkeypatch.setenv(arrow_pool.VARIABLE, arrow_pool.COMMAND_POOL)
    monkeypatch.setattr(arrow_pool, "_chosen", True)
    with local_cluster(1, dashboard_address=None) as ours, Client(ours) as client:
        ((variable, backend),) = client.run(pool).values()
    assert variable is None and backend != "system"
    assert os.environ[arrow_pool.VARIABLE] == arrow_pool.COMMAND_POOL

    monkeypatch.setattr(arrow_pool, "_chosen", False)  # the user's own choice: kept
    with local_cluster(1, dashboard_address=None) as ours, Client(ours) as client:
        assert list(client.run(pool).values()) == [("system", "system")]
