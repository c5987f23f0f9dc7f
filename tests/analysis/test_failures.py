"""Failures are first-class: every request's outcome comes from its client span, TTFT and
attribution are over the requests that did not fail, the failed ones are counted by kind
(with examples, and apart when they saw a first token), `compare` tests failure rates."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from _build import event, row, table, tid
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from ttft.analysis import analyze, assemble, attribute
from ttft.analysis._outcomes import _by_rules, client_outcomes
from ttft.analysis.compare import compare_failures, failure_regressions
from ttft.collectors import write_trace
from ttft.reports.cli import app

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def client(trace: int, ttft_ms: float | None, **attributes) -> list[dict]:
    """A client span of 50 ms and, when it saw one, its first_token event."""
    t0 = T0 + trace * 100 * MS
    rows = [row(trace, 1, "client", t0, t0 + 50 * MS, clock="client", service="loadgen",
                **attributes)]
    if ttft_ms is not None:
        rows.append(event(trace, 2, "first_token", t0 + int(ttft_ms * MS), parent=1,
                          clock="client", service="loadgen"))
    return rows


def mixed() -> list[dict]:
    rows = []
    for i in range(6):
        rows += client(i, 10 + i, outcome="ok", status_code=200)
    rows += client(10, None, outcome="shed", status_code=429, error="HTTP 429: busy")
    rows += client(11, None, outcome="shed", status_code=429, error="HTTP 429: busy")
    rows += client(12, 40, outcome="disconnected", status_code=200,
                   error="ConnectionError: the server closed the connection")
    # written before outcomes existed: read back from status and error
    rows += client(13, None, status_code=503, error="HTTP 503: later")
    rows += client(14, None, status_code=None, error="timed out after 5 s")
    return rows


def test_outcomes_come_from_the_client_span_and_old_traces_are_read_back():
    asm = assemble(table(mixed()))
    by_trace = dict(zip(asm.requests["trace_id"], asm.requests["outcome"], strict=True))
    assert [by_trace[tid(i)] for i in (0, 10, 12, 13, 14)] == [
        "ok", "shed", "disconnected", "shed", "timeout"]
    assert list(asm.ok()) == [True] * 6 + [False] * 5


def test_ttft_is_over_ok_requests_and_failures_are_counted_apart():
    analysis = analyze(table(mixed()))
    summary = analysis.summary.to_dict()
    assert summary["requests"] == 11 and summary["requests_ok"] == 6
    assert summary["failures"] == {"shed": 3, "timeout": 1, "disconnected": 1}
    assert summary["ttft_ms"]["p50"] == pytest.approx(12.5)  # 10..15 ms: ok requests only
    assert summary["quality"]["no_window"] == 0  # a failure is not a data defect
    assert summary["failed_first_token"] == {
        "requests": 1, "ttft_ms": {"p50": 40.0, "p90": 40.0, "p99": 40.0, "mean": 40.0}}
    assert summary["failure_examples"]["shed"] == [
        {"trace_id": tid(10), "status_code": 429, "error": "HTTP 429: busy"},
        {"trace_id": tid(11), "status_code": 429, "error": "HTTP 429: busy"},
        {"trace_id": tid(13), "status_code": 503, "error": "HTTP 503: later"},
    ]
    attr = analysis.attribution
    assert len(attr.requests) == 6 and len(attr.failed) == 5
    assert (attr.attributed.to_numpy().sum(axis=1) == attr.requests["ttft_ns"]).all()


def test_analyze_prints_failures_first_and_json_carries_them(tmp_path):
    path = tmp_path / "mixed.parquet"
    write_trace(path, table(mixed()))
    runner = CliRunner()
    printed = runner.invoke(app, ["analyze", str(path)])
    assert printed.exit_code == 0, printed.output
    text = " ".join(printed.stdout.split())
    failures = text.index("failures: 5 of 11 requests (45.5%): shed 3 (27.3%), timeout 1")
    assert failures < text.index("ok requests")  # first, before any TTFT table
    assert "TTFT below is over the 6 ok requests" in text
    data = json.loads(runner.invoke(app, ["analyze", str(path), "--json"]).stdout)
    assert (data["requests"], data["requests_ok"]) == (11, 6)
    assert list(data)[5:9] == ["requests_ok", "failures", "failure_examples",
                               "failed_first_token"]


def shed_trace(n_ok: int, n_shed: int, offset: int = 0) -> list[dict]:
    rows = []
    for i in range(n_ok):
        rows += client(offset + i, 10, outcome="ok", status_code=200)
    for i in range(n_shed):
        rows += client(offset + n_ok + i, None, outcome="shed", status_code=429,
                       error="HTTP 429")
    return rows


def test_compare_tests_failure_rates_and_gates_on_a_significant_rise():
    same_a = attribute(assemble(table(shed_trace(165, 35))))
    same_b = attribute(assemble(table(shed_trace(159, 41, offset=1000))))
    close = compare_failures(same_a, same_b, resamples=2000, seed=1)
    assert close.loc[0, ["a_failed", "b_failed", "a_requests"]].tolist() == [35, 41, 200]
    assert close.loc[0, "delta_pp"] == pytest.approx(3.0)
    assert close.loc[0, "ci_lo_pp"] < 0 < close.loc[0, "ci_hi_pp"]  # 35 vs 41: noise
    assert failure_regressions(close, 10).empty
    worse = attribute(assemble(table(shed_trace(120, 80, offset=2000))))
    rise = compare_failures(same_a, worse, resamples=2000, seed=1)
    assert bool(rise.loc[0, "significant"]) and rise.loc[0, "ci_lo_pp"] > 0
    assert rise.loc[0, "b_kinds"] == {"shed": 80}
    assert list(failure_regressions(rise, 10)["condition"]) == ["all"]
    again = compare_failures(same_a, worse, resamples=2000, seed=1)
    assert np.array_equal(again["ci_lo_pp"], rise["ci_lo_pp"])  # seeded


def test_compare_cli_fails_the_gate_on_more_failures_not_on_their_ttft(tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_trace(a, table(shed_trace(165, 35)))
    write_trace(b, table(shed_trace(120, 80, offset=2000)))
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--max-regression", "10"])
    assert result.exit_code == 1, result.output
    assert "failures (all) 17.5% → 40.0%" in result.stderr.replace("\n", " ")
    assert "TTFT p" not in result.stderr  # equal ok TTFTs: only the failure rate regressed


_OUTCOME_PIECES = st.sampled_from([
    '"outcome"', ":", '"ok"', '"shed"', '"timeout"', '"okay"', '"error"', '"timed out"',
    '"status_code"', "429", "200", " ", ",", "{", "}", '"x"', '\\"outcome\\"',
])


@given(st.lists(st.one_of(st.none(), st.lists(_OUTCOME_PIECES, max_size=12).map("".join)),
                max_size=30))
def test_outcomes_found_by_substrings_equal_the_rules(texts):
    attributes = pa.chunked_array([pa.array(texts, pa.string())])
    rows = np.arange(len(texts))
    want = _by_rules(attributes, rows, attributes.chunk(0))
    assert client_outcomes(attributes, rows).tolist() == want.tolist()


def test_a_request_of_two_failed_client_spans_takes_the_first_started_whatever_the_row_order():
    # Two client traces joined by request id (a retry): one timed out, the later one shed.
    rows = client(20, None, outcome="timeout", error="timed out after 5 s", request_id="r")
    rows += client(21, None, outcome="shed", status_code=429, error="HTTP 429: busy",
                   request_id="r")
    outcomes = set()
    for order in (rows, rows[::-1], rows[2:] + rows[:2]):
        req = assemble(table(order)).requests
        assert len(req) == 1
        outcomes.add((req["outcome"][0], req["status_code"][0], req["error"][0]))
    assert outcomes == {("timeout", None, "timed out after 5 s")}


def test_outcomes_are_read_from_top_level_keys_whatever_the_nesting_or_escapes():
    texts = [
        '{"outcome":"ok","detail":{"outcome":"shed"}}',  # a nested outcome is not the span's
        '{"outcome":"sh\\u0065d"}',  # an escape spells "shed"
        '{"a":{"error":"timed out"}}',  # a nested error is no legacy failure
        '{"x\\"outcome":"ok","error":"boom"}',  # no outcome key; an error: legacy rules
        '{"status_code":429,"error":"HTTP 429"}',
        '{"outcome":"timeout","error":"timed out after 5 s"}',
        '{"outcome":"ok"}',
        '"outcome":"shed"',  # no JSON object: read by the patterns, as before
    ]
    attributes = pa.chunked_array([pa.array(texts, pa.string())])
    got = client_outcomes(attributes, np.arange(len(texts))).tolist()
    assert got == ["ok", "shed", "ok", "disconnected", "shed", "timeout", "ok", "shed"]


@pytest.mark.parametrize("kind", ["timeout", "shed"])
def test_a_run_whose_every_request_failed_is_a_failure_regression_not_an_error(tmp_path, kind):
    """Found: compare stopped (exit 2) when B had no ok request, so a gate never saw the
    service go down; and analyze --json gave that run a TTFT of 0.0 ms."""
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_trace(a, table(shed_trace(40, 0)))
    # timed out after a first token (a window, no ok request), or shed before one (none)
    rows = []
    for i in range(30):
        rows += client(100 + i, 20 if kind == "timeout" else None, outcome=kind,
                       error="timed out" if kind == "timeout" else "HTTP 503", status_code=503)
    write_trace(b, table(rows))
    runner = CliRunner()
    data = json.loads(runner.invoke(app, ["analyze", str(b), "--json"]).stdout)
    assert (data["requests"], data["requests_ok"], data["ttft_ms"]) == (30, 0, None)
    result = runner.invoke(app, ["compare", str(a), str(b), "--max-regression", "10",
                                 "--resamples", "200"])
    assert result.exit_code == 1, result.output
    stderr = " ".join(result.stderr.split())
    assert "failures (all) 0.0% → 100.0%" in stderr
    assert "TTFT is not compared" in stderr and "TTFT p" not in stderr
    out = json.loads(runner.invoke(app, ["compare", str(a), str(b), "--json",
                                         "--resamples", "200"]).stdout)
    assert out["rows"] == [] and out["failures"][0]["b_rate"] == 1.0
