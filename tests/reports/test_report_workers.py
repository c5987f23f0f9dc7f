"""``ttft report|compare DATASET --workers N | --scheduler ADDRESS``: the report data, its
HTML and terminal texts and the comparison tables made on a Dask cluster equal exactly what
one process makes of the same spans (issue 17).

The driver (``reports.runs.analyses``) runs on one in-process cluster shared by the
module; the command lines run as subprocesses, one ``--workers 2`` each for ``report`` and
``compare`` (a ``LocalCluster`` of worker processes cannot start inside a CliRunner call),
the others on that cluster's scheduler."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from functools import cache

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ttft.analysis import analyze
from ttft.analysis.compare import compare, compare_failures
from ttft.analysis.partition import partition_rows
from ttft.collectors import read_spans
from ttft.collectors.dataset_write import write_dataset
from ttft.collectors.synthetic import generate
from ttft.reports._text import PlainConsole
from ttft.reports.html_report import render_html
from ttft.reports.report_data import ReportData, build_report
from ttft.reports.terminal_report import render_report
from ttft.tracer.schema import METADATA_KEY, SCHEMA_VERSION

pytest.importorskip("distributed")

TIMEOUT_S = 120
SHIFT_NS = 3_700_000_000
MODEL = {"n_layer": 4, "d_model": 512, "n_head": 8, "n_kv_head": 4, "d_ff": 1536,
         "vocab_size": 32000, "dtype": "bfloat16"}
RUN = {"model_config": MODEL, "device": {"name": "H100 SXM"}}


@cache
def traces() -> dict[str, pa.Table]:
    """One host with a model and device in its metadata (so the report has a regime), two
    hosts whose server clock reads 3.7 s ahead, one with the model and device in an event,
    and a second run to compare with."""
    one = generate(300, seed=7).table
    one = one.replace_schema_metadata({METADATA_KEY: json.dumps(RUN)})
    two = generate(80, seed=11).table
    moved = pc.not_equal(two.column("clock").cast(pa.string()), "client")
    for name in ("start_ns", "end_ns"):
        shifted = pc.if_else(moved, pc.add(two.column(name), SHIFT_NS), two.column(name))
        two = two.set_column(two.schema.get_field_index(name), name, shifted)
    return {"one_host": one, "two_hosts": two, "engine_info": with_engine_info(generate(150)),
            "other": generate(200, seed=3).table}


def with_engine_info(run) -> pa.Table:
    """The synthetic run with the model and device in an ``engine_info`` event of its first
    engine step trace (as the reference engine records them) instead of its metadata."""
    frame = run.table.to_pandas()
    event = frame[frame["stage"] == "step"].iloc[[0]].copy()
    event["name"], event["stage"], event["end_ns"] = "engine_info", "event", event["start_ns"]
    event["attributes"] = json.dumps({**{f"model.{k}": v for k, v in MODEL.items()},
                                      "device.name": "H100 SXM"})
    return pa.Table.from_pandas(pd.concat([frame, event], ignore_index=True),
                                schema=run.table.schema, preserve_index=False)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """``(name, partitions) -> dataset path`` for 1, 2 and 5 partitions of each trace."""
    root = tmp_path_factory.mktemp("report_workers")
    out = {}
    for name, table in traces().items():
        for n in (1, 2, 5):
            p = partition_rows(table, n)
            out[name, n] = root / f"{name}-{n}"
            write_dataset(out[name, n], table, p.owner, p.copy_rows, p.copy_partitions, n,
                          p.key)
    return out


@pytest.fixture(scope="module")
def client():
    """A client of one in-process cluster (two worker threads) on the loopback, whose
    scheduler the command lines also reach."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp://",
                      host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as c:
        yield c


def one_process(path) -> ReportData:
    return build_report(analyze(read_spans(path), trace=str(path)))


def on_dask(path, client, **options) -> ReportData:
    from ttft.collectors import TraceLocation
    from ttft.reports.runs.analyses import OnDask, report_location

    return report_location(TraceLocation(str(path)), OnDask(client), **options)


def in_partitions(path, client) -> ReportData:
    return on_dask(path, client)


def assert_same_report(got: ReportData, want: ReportData) -> None:
    assert got.summary.to_dict() == want.summary.to_dict()
    assert got.metadata == want.metadata
    assert {g: int(m.sum()) for g, m in got.groups.items()} == {
        g: int(m.sum()) for g, m in want.groups.items()}
    for group in want.groups:
        pd.testing.assert_frame_equal(got.bands[group], want.bands[group], check_exact=True)
        assert np.array_equal(got.cdf_ms[group], want.cdf_ms[group])
    pd.testing.assert_frame_equal(got.blame, want.blame, check_exact=True)
    pd.testing.assert_frame_equal(got.prefill_points, want.prefill_points, check_exact=True)
    assert got.prefill_fits == want.prefill_fits
    assert len(got.waterfalls) == len(want.waterfalls) > 0
    for a, b in zip(got.waterfalls, want.waterfalls, strict=True):
        assert (a.label, a.trace_id, a.condition, a.ttft_ms, a.window_ms, a.events,
                a.parts_ms) == (b.label, b.trace_id, b.condition, b.ttft_ms, b.window_ms,
                                b.events, b.parts_ms)
        pd.testing.assert_frame_equal(a.spans, b.spans, check_exact=True)
    assert (got.regime.frame is None) == (want.regime.frame is None)
    if want.regime.frame is not None:
        pd.testing.assert_frame_equal(got.regime.frame, want.regime.frame, check_exact=True)
        pd.testing.assert_frame_equal(got.regime.summary, want.regime.summary,
                                      check_exact=True)
    assert (got.regime.peaks, got.regime.device_name) == (want.regime.peaks,
                                                          want.regime.device_name)


@pytest.mark.parametrize("partitions", [1, 2, 5])
@pytest.mark.parametrize("name", ["one_host", "two_hosts", "engine_info"])
def test_report_data_of_partitions_equals_one_process(datasets, client, name, partitions):
    path = datasets[name, partitions]
    got, want = in_partitions(path, client), one_process(path)
    assert_same_report(got, want)
    assert (want.regime.frame is not None) == (name != "two_hosts")
    if name == "two_hosts":
        applied = [c for c in got.summary.to_dict()["clocks"] if c["applied"]]
        assert len(applied) == 1 and abs(applied[0]["offset_ms"] * 1e6 + SHIFT_NS) < 1e6
    # and the whole trace as one table gives the same report (the dataset's writer adds the
    # schema version to the run metadata)
    whole = build_report(analyze(traces()[name], trace=str(path)))
    assert {**whole.metadata, "schema_version": SCHEMA_VERSION} == got.metadata
    assert_same_report(got, replace(whole, metadata=got.metadata))


def untimed(html: str) -> str:
    """The page without the minute it was made in."""
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "(made)", html)


@pytest.mark.parametrize(("boundary", "policy"), [("server", "shared"),
                                                  ("engine", "critical-path")])
def test_report_data_at_another_boundary_and_policy_equals_one_process(datasets, client,
                                                                      boundary, policy):
    path = datasets["two_hosts", 5]
    got = on_dask(path, client, boundary=boundary, policy=policy)
    want = build_report(analyze(read_spans(path), boundary=boundary, policy=policy,
                                trace=str(path)))
    assert (got.attribution.boundary, got.attribution.policy) == (boundary, policy)
    assert_same_report(got, want)


def texts(data: ReportData) -> tuple[str, str]:
    console = PlainConsole(file=io.StringIO(), width=120)
    render_report(data, console)
    return untimed(render_html(data)), console.file.getvalue()


def test_html_and_terminal_texts_of_partitions_equal_one_process(datasets, client):
    path = datasets["one_host", 5]
    html, terminal = texts(in_partitions(path, client))
    want_html, want_terminal = texts(one_process(path))
    assert "Prefill regime" in html and "H100 SXM" in html
    assert html == want_html
    assert terminal == want_terminal


@pytest.mark.parametrize("partitions", [1, 5])
def test_compare_of_partitions_equals_one_process(datasets, client, partitions):
    from ttft.collectors import TraceLocation
    from ttft.reports.runs.analyses import OnDask, compare_locations

    a, b = datasets["one_host", partitions], datasets["other", 2]
    got = [r.attribution for r in compare_locations(
        [TraceLocation(str(a)), TraceLocation(str(b))], OnDask(client))]
    want = [analyze(read_spans(path)).attribution for path in (a, b)]
    table = compare(*got, resamples=200, seed=3)
    # two seeds of one workload: no row is a change (Holm), but the p-values are real
    assert table["p_value"].between(0, 1, inclusive="neither").any() and len(table) > 9
    pd.testing.assert_frame_equal(table, compare(*want, resamples=200, seed=3),
                                  check_exact=True)
    pd.testing.assert_frame_equal(compare_failures(*got, resamples=200),
                                  compare_failures(*want, resamples=200), check_exact=True)


def test_compare_does_not_depend_on_the_requests_order():
    attrs = [analyze(traces()[name]).attribution for name in ("one_host", "other")]
    backwards = []
    for attr in attrs:
        flipped = attr.requests.index[::-1]
        backwards.append(type(attr)(attr.boundary, attr.policy,
                                    attr.requests.loc[flipped].reset_index(drop=True),
                                    attr.attributed.loc[flipped].reset_index(drop=True),
                                    attr.covered, attr.raw, attr.quality, attr.failed))
    pd.testing.assert_frame_equal(compare(*backwards, resamples=100),
                                  compare(*attrs, resamples=100), check_exact=True)


# --- the command lines ------------------------------------------------------------------


def ttft(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ttft.reports.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={**os.environ, "COLUMNS": "120"})


def ok(*args) -> str:
    result = ttft(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_report_workers_writes_the_one_process_html(datasets, tmp_path):
    path = datasets["one_host", 5]
    result = ttft("report", path, "-o", tmp_path / "w.html", "--workers", 2)
    assert result.returncode == 0, result.stderr
    assert "analysed 5 partitions on 2 Dask workers" in result.stderr
    ok("report", path, "-o", tmp_path / "one.html")
    assert untimed((tmp_path / "w.html").read_text()) == untimed(
        (tmp_path / "one.html").read_text())


def test_report_on_a_scheduler_prints_the_one_process_report(datasets, client):
    path = datasets["two_hosts", 2]
    printed = ok("report", path, "--scheduler", client.scheduler.address)
    assert "host:synth → client offset -3,700.000 ms" in printed
    assert printed == ok("report", path)


def test_compare_workers_prints_the_one_process_table(datasets):
    a, b = datasets["one_host", 2], datasets["other", 5]
    options = ["--json", "--resamples", 200, "--slo", "ttft=300ms"]
    result = ttft("compare", a, b, *options, "--workers", 2)
    assert result.returncode == 0, result.stderr
    assert "analysed 7 partitions on 2 Dask workers" in result.stderr
    assert result.stdout == ok("compare", a, b, *options)
    assert json.loads(result.stdout)["rows"]


@pytest.mark.parametrize("command", [["report"], ["compare", "OTHER"]])
def test_workers_on_a_plain_trace_is_refused_in_one_line(datasets, tmp_path, command):
    trace = tmp_path / "t.parquet"
    pq.write_table(traces()["other"], trace)
    args = [datasets["other", 2] if a == "OTHER" else a for a in command]
    result = ttft(*args[:1], trace, *args[1:], "--workers", 2)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a partitioned dataset" in lines[0], result.stderr
    assert result.stdout == ""
