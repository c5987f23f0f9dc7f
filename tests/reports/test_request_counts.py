"""The request counts of one file add up across commands: failed, ok with a TTFT window and
ok without one (``no_window``, left out of TTFT) are each named, and what ``analyze``,
``report``, ``load`` and ``export --csv`` count is their sum."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from ttft.collectors import write_trace
from ttft.collectors.synthetic import generate
from ttft.reports.cli import app

runner = CliRunner()
N, FAILED, NO_WINDOW = 20, 3, 2


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """``N`` requests: ``FAILED`` time out, ``NO_WINDOW`` lost their ``first_token`` event."""
    tab = generate(N, seed=4).table
    stage = tab.column("stage").cast(pa.string()).to_pylist()
    trace_ids = tab.column("trace_id").to_pylist()
    clients = [t for t, s in zip(trace_ids, stage, strict=True) if s == "client"]
    failed, lost = set(clients[:FAILED]), set(clients[FAILED:FAILED + NO_WINDOW])
    attributes = [
        json.dumps({"outcome": "timeout", "error": "read timeout"})
        if s == "client" and t in failed else a
        for s, a, t in zip(stage, tab.column("attributes").to_pylist(), trace_ids, strict=True)
    ]
    i = tab.schema.get_field_index("attributes")
    tab = tab.set_column(i, tab.schema.field("attributes"), pa.array(attributes, pa.string()))
    drop = pc.and_(pc.equal(tab.column("name"), "first_token"),
                   pc.is_in(tab.column("trace_id"), pa.array(sorted(lost))))
    path = tmp_path_factory.mktemp("counts") / "t.parquet"
    write_trace(path, tab.filter(pc.invert(drop)))
    return path


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_analyze_names_every_request(trace):
    found = json.loads(invoke("analyze", str(trace), "--json", "--slo", "ttft=10s"))
    assert found["requests"] == N - NO_WINDOW and found["requests_ok"] == N - FAILED - NO_WINDOW
    assert found["quality"]["no_window"] == NO_WINDOW
    # completed from the client's view: every ok request, with a window or not
    assert found["load"]["requests"] == found["requests_ok"] + NO_WINDOW
    head = invoke("analyze", str(trace)).splitlines()[0]
    ok = N - FAILED - NO_WINDOW
    assert f"requests={N - NO_WINDOW} ({ok} ok), {NO_WINDOW} more left out" in head


def test_report_headlines_name_the_left_out_requests(trace, tmp_path):
    assert f"{NO_WINDOW} more left out" in invoke("report", str(trace)).splitlines()[0]
    out = tmp_path / "r.html"
    invoke("report", str(trace), "-o", str(out))
    assert f"{NO_WINDOW} more requests left out: no TTFT window" in out.read_text()


def test_the_csv_has_a_row_for_each_of_them(trace, tmp_path):
    out = tmp_path / "r.csv"
    invoke("export", str(trace), "--csv", str(out))
    rows = pd.read_csv(out)
    assert len(rows) == N
    assert (rows["outcome"] == "ok").sum() == N - FAILED
    assert rows["ttft_ms"].isna().sum() >= NO_WINDOW  # the ones without a window have none


def test_a_trace_without_lost_windows_says_nothing_more(tmp_path):
    path = tmp_path / "ok.parquet"
    write_trace(path, generate(10, seed=1).table)
    head = invoke("analyze", str(path)).splitlines()[0]
    assert head.endswith("requests=10 (10 ok)")


def test_compare_names_them_per_side(trace, tmp_path):
    clean = tmp_path / "clean.parquet"
    write_trace(clean, generate(N, seed=4).table)
    found = json.loads(invoke("compare", str(clean), str(trace), "--json", "--resamples", "50"))
    assert found["no_window"] == {"a": 0, "b": NO_WINDOW}
    text = invoke("compare", str(clean), str(trace), "--resamples", "50")
    assert f"requests A={N} B={N - FAILED - NO_WINDOW}" in text
    assert f"left out, no TTFT window at this boundary: A 0 B {NO_WINDOW}" in text
