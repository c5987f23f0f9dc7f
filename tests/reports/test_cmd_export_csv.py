"""``ttft export TRACE --csv OUT.csv``: one row per request, failed ones included, with
when each started, read back with the csv module; an engine-only trace's requests start
at their window; an unwritable path and no output asked for exit 2."""

from __future__ import annotations

import csv

import pytest
from _build import event, row, table, tid
from typer.testing import CliRunner

from ttft.collectors import write_trace
from ttft.reports.cli import app

runner = CliRunner()
MS = 1_000_000
T0 = 1_700_000_000_000_000_000
CLIENT = {"clock": "client", "service": "loadgen"}


def request(trace: int, tokens_ms: list[int], end_ms: int, **attributes) -> list[dict]:
    """A client span from ``trace`` x 100 ms after T0, a server span over its first 8 ms
    whose first_byte is 5 ms in, and the client's chunks ``tokens_ms`` after its start."""
    t0 = T0 + trace * 100 * MS
    rows = [row(trace, 1, "client", t0, t0 + end_ms * MS, **CLIENT, **attributes)]
    if tokens_ms:
        rows += [row(trace, 3, "server", t0 + 1 * MS, t0 + 8 * MS, parent=1, service="srv"),
                 event(trace, 4, "first_byte", t0 + 5 * MS, parent=3, service="srv")]
    for i, when in enumerate(tokens_ms):
        rows.append(event(trace, 10 + i, "first_token" if i == 0 else "token",
                          t0 + when * MS, parent=1, **CLIENT))
    return rows


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    rows = [
        *request(1, [10, 20, 30], 40, outcome="ok", status_code=200, prompt_tokens=7,
                 completion_tokens=5),
        *request(2, [6], 12, outcome="ok", status_code=200),
        *request(3, [], 3, outcome="shed", status_code=429, error="HTTP 429: busy"),
    ]
    return write_trace(tmp_path_factory.mktemp("csv") / "t.parquet", table(rows))


def test_one_row_per_request_with_its_figures(trace, tmp_path):
    out = tmp_path / "requests.csv"
    result = runner.invoke(app, ["export", str(trace), "--csv", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: 3 requests" in " ".join(result.output.split())
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == [
        "trace_id", "request_id", "condition", "outcome", "status_code", "start_ns",
        "start_time", "start_offset_ms", "ttft_ms", "server_ms", "network_ms", "tpot_ms",
        "itl_ms", "e2e_ms", "prompt_tokens", "completion_tokens"]
    assert [r["trace_id"] for r in rows] == [tid(1), tid(2), tid(3)]
    # each request's client span starts 100 ms after the one before; the failed one too
    assert [(r["start_ns"], r["start_time"], r["start_offset_ms"]) for r in rows] == [
        (str(T0 + 100 * MS), "2023-11-14T22:13:20.100000Z", "0.0"),
        (str(T0 + 200 * MS), "2023-11-14T22:13:20.200000Z", "100.0"),
        (str(T0 + 300 * MS), "2023-11-14T22:13:20.300000Z", "200.0")]
    assert [(r["outcome"], r["status_code"]) for r in rows] == [
        ("ok", "200"), ("ok", "200"), ("shed", "429")]
    # TTFT 10 ms: the server's window [1, 5) ms, the rest is network
    assert {k: rows[0][k] for k in ("ttft_ms", "server_ms", "network_ms")} == {
        "ttft_ms": "10.0", "server_ms": "4.0", "network_ms": "6.0"}
    assert (rows[0]["tpot_ms"], rows[0]["itl_ms"], rows[0]["e2e_ms"]) == ("5.0", "10.0", "40.0")
    assert (rows[0]["prompt_tokens"], rows[0]["completion_tokens"]) == ("7", "5")
    # one chunk: no TPOT or ITL; no usage: no token counts
    assert [rows[1][k] for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "prompt_tokens")] \
        == ["6.0", "", "", "12.0", ""]
    # the failed request: no TTFT, no stages, its own end-to-end time
    assert [rows[2][k] for k in ("ttft_ms", "server_ms", "tpot_ms", "e2e_ms")] == [
        "", "", "", "3.0"]


def test_an_unwritable_path_and_no_output_exit_2(trace, tmp_path):
    result = runner.invoke(app, ["export", str(trace), "--csv", str(tmp_path / "no" / "x.csv")])
    assert result.exit_code == 2
    assert "cannot write" in result.output
    result = runner.invoke(app, ["export", str(trace)])
    assert result.exit_code == 2
    assert "give --perfetto OUT.json or --csv OUT.csv" in result.output


def test_csv_and_perfetto_in_one_run(trace, tmp_path):
    result = runner.invoke(app, ["export", str(trace), "--csv", str(tmp_path / "r.csv"),
                                 "--perfetto", str(tmp_path / "t.json")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.csv").exists() and (tmp_path / "t.json").exists()


def test_an_engine_only_request_starts_at_its_window(tmp_path):
    """Without a client span a request's start is its window's at the boundary: here the
    server's span's start, its TTFT up to ``first_byte``."""
    t0 = T0 + 100 * MS
    rows = [row(1, 3, "server", t0, t0 + 8 * MS, service="srv"),
            event(1, 4, "first_byte", t0 + 5 * MS, parent=3, service="srv"),
            row(2, 3, "server", t0 + 40 * MS, t0 + 50 * MS, service="srv"),
            event(2, 4, "first_byte", t0 + 43 * MS, parent=3, service="srv")]
    path = write_trace(tmp_path / "engine.parquet", table(rows))
    out = tmp_path / "requests.csv"
    result = runner.invoke(app, ["export", str(path), "--csv", str(out)])
    assert result.exit_code == 0, result.output
    with out.open(newline="") as f:
        got = [(r["start_ns"], r["start_time"], r["start_offset_ms"], r["ttft_ms"])
               for r in csv.DictReader(f)]
    assert got == [(str(t0), "2023-11-14T22:13:20.100000Z", "0.0", "5.0"),
                   (str(t0 + 40 * MS), "2023-11-14T22:13:20.140000Z", "40.0", "3.0")]
