"""Requests the run's stop cut short (outcome ``cancelled``): a failure kind beside the others,
counted in failures and never in TTFT, and no data-quality defect for the spans such a
request leaves (children of a ``server`` span that never ended, so never arrived). An
``ok`` request with the same spans still counts them."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from _build import event, row, table, tid

from ttft.analysis import analyze
from ttft.analysis._outcomes import client_outcomes
from ttft.tracer.schema import OUTCOME_CANCELLED, OUTCOMES

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
STOPPED = "the run stopped before the response ended"


def request(trace: int, *, outcome: str, ttft_ms: float | None,
            orphan: bool = False) -> list[dict]:
    """A client span of 50 ms (span 1; with a first_token at ``ttft_ms``) and a server span
    (span 2) inside it, or (``orphan``) what a cut-off request leaves instead: a ``queue``
    span whose parent (span 9, the server span that never ended) is missing."""
    t0 = T0 + trace * 100 * MS
    attrs = {"outcome": outcome, "status_code": 200}
    if outcome != "ok":
        attrs["error"] = STOPPED
    rows = [row(trace, 1, "client", t0, t0 + 50 * MS, clock="client", service="loadgen",
                **attrs)]
    if ttft_ms is not None:
        rows.append(event(trace, 3, "first_token", t0 + int(ttft_ms * MS), parent=1,
                          clock="client", service="loadgen"))
    if not orphan:
        rows.append(row(trace, 2, "server", t0 + 1 * MS, t0 + 45 * MS, parent=1))
        rows.append(event(trace, 4, "first_byte", t0 + int((ttft_ms or 40) * MS) - MS,
                          parent=2))
    else:
        rows.append(row(trace, 5, "queue", t0 + 2 * MS, t0 + 4 * MS, parent=9))
    return rows


def test_cancelled_is_an_outcome_kind_read_from_the_client_span():
    assert OUTCOMES[-1] == OUTCOME_CANCELLED == "cancelled"
    texts = [json.dumps({"outcome": "cancelled", "status_code": 200, "error": STOPPED}),
             json.dumps({"outcome": "cancelled", "status_code": None, "error": STOPPED}),
             '{"outcome": "cancelled", "error": "cut"',  # malformed: read by patterns
             json.dumps({"outcome": "ok", "status_code": 200})]
    attributes = pa.chunked_array([pa.array(texts)])
    assert list(client_outcomes(attributes, np.arange(len(texts)))) == [
        "cancelled", "cancelled", "cancelled", "ok"]


def test_cancelled_requests_are_failures_never_ttft_and_leave_no_defects():
    rows = []
    for i in range(4):
        rows += request(i, outcome="ok", ttft_ms=10 + i)
    rows += request(10, outcome=OUTCOME_CANCELLED, ttft_ms=30, orphan=True)
    rows += request(11, outcome=OUTCOME_CANCELLED, ttft_ms=None, orphan=True)
    summary = analyze(table(rows)).summary.to_dict()
    assert (summary["requests"], summary["requests_ok"]) == (6, 4)
    assert summary["failures"] == {OUTCOME_CANCELLED: 2}
    assert summary["failure_examples"][OUTCOME_CANCELLED] == [
        {"trace_id": tid(10), "status_code": 200, "error": STOPPED},
        {"trace_id": tid(11), "status_code": 200, "error": STOPPED}]
    assert summary["ttft_ms"]["p50"] == 11.5  # 10..13 ms: the ok requests only
    assert summary["failed_first_token"]["requests"] == 1  # the cancelled one that saw it
    assert summary["quality"] == dict.fromkeys(summary["quality"], 0)


def test_the_same_spans_of_an_ok_request_are_still_defects():
    rows = request(0, outcome="ok", ttft_ms=10, orphan=True)
    rows += request(1, outcome=OUTCOME_CANCELLED, ttft_ms=10, orphan=True)
    quality = analyze(table(rows)).attribution.quality
    counted = {d: n for d, n in quality.counts.items() if n}
    assert counted == {"orphan_parent": 1}
    assert quality.examples["orphan_parent"] == [tid(0)]
