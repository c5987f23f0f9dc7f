"""Load metrics (``analysis.load``): throughput over the run's duration from the client's
view, end-to-end latency, and goodput against SLOs, exact on a hand-built trace; a
request lacking TPOT/ITL does not violate them, a failed one never meets an SLO; an
engine-only trace has no load; a dataset in partitions gives one process's goodput."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from _build import event, row, table, tid
from test_part import in_partitions, split

from ttft.analysis import analyze, assemble, attribute, summarize
from ttft.analysis.load import goodput, load, load_values, request_table
from ttft.analysis.request_values import request_values

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
CLIENT = {"clock": "client", "service": "loadgen"}


def client(trace: int, start_ms: int, end_ms: int, tokens_ms: list[int], **attributes):
    """A client span [start, end) ms after T0 with content chunks at ``tokens_ms`` after
    its start (the first one is ``first_token``)."""
    t0 = T0 + start_ms * MS
    rows = [row(trace, 1, "client", t0, T0 + end_ms * MS, **CLIENT, **attributes)]
    for i, when in enumerate(tokens_ms):
        rows.append(event(trace, 2 + i, "first_token" if i == 0 else "token",
                          t0 + when * MS, parent=1, **CLIENT))
    return rows


def trace_rows() -> list[dict]:
    """TTFT 10 / 40 / 200 ms, TPOT 5 / 60 / none, ITL 10 / 60 / none, e2e 100 / 200 / 300
    ms, 5 + 2 (chunks, no usage) + 1 tokens; one shed request of 700 ms ends the run at
    1 s."""
    return [
        *client(1, 0, 100, [10, 20, 30], outcome="ok", status_code=200, completion_tokens=5,
                prompt_tokens=12),
        *client(2, 50, 250, [40, 100], outcome="ok", status_code=200),
        *client(3, 100, 400, [200], outcome="ok", status_code=200, completion_tokens=1),
        *client(4, 300, 1000, [], outcome="shed", status_code=429, error="HTTP 429: busy"),
    ]


@pytest.fixture(scope="module")
def analysed():
    return analyze(table(trace_rows()))


def test_throughput_is_over_the_run_from_first_start_to_last_end(analysed):
    assert analysed.summary.to_dict()["load"] == {
        "duration_s": 1.0,
        "requests": 3,
        "requests_per_s": 3.0,
        "output_tokens": 8,
        "output_tokens_per_s": 8.0,
        "e2e_ms": {"p50": 200.0, "p90": float(np.percentile([100.0, 200.0, 300.0], 90)),
                   "p99": float(np.percentile([100.0, 200.0, 300.0], 99)), "mean": 200.0,
                   "requests": 3},
        "content_filter": 0,
    }
    assert analysed.summary.goodput is None and "goodput" not in analysed.summary.to_dict()


def test_per_request_tpot_and_itl_line_up_with_the_attributed_requests(analysed):
    values = load_values(analysed.assembly, analysed.attribution)
    assert list(values["ttft_ns"]) == [10 * MS, 40 * MS, 200 * MS]
    assert list(values["e2e_ns"]) == [100 * MS, 200 * MS, 300 * MS]
    np.testing.assert_array_equal(values["tpot_ns"], [5 * MS, 60 * MS, np.nan])
    np.testing.assert_array_equal(values["itl_ns"], [10 * MS, 60 * MS, np.nan])
    assert list(values["completed"]) == [True, True, True, False]


@pytest.mark.parametrize(("slo", "meeting"), [
    ({"ttft": 50}, 2),  # 10, 40 ms; not 200 ms
    ({"tpot": 10}, 2),  # 5 ms, and the request with one chunk has no TPOT to violate
    ({"ttft": 50, "tpot": 10}, 1),  # every SLO at once
    ({"itl": 10}, 2),  # at the limit meets it
    ({"e2e": 250}, 2),
    ({"e2e": 10_000}, 3),  # the failed request never meets an SLO
    ({"ttft": 1}, 0),
])
def test_goodput_counts_requests_meeting_every_slo_over_all_requests(analysed, slo, meeting):
    attr = analysed.attribution
    good = summarize(attr, request_values(analysed.assembly, attr), slo=slo).goodput
    stages = good.pop("ttft_stages", None)  # analysis.slo's part, tested in test_slo.py
    assert (stages is not None) == ("ttft" in slo)
    if stages is not None:
        assert stages["slo_ms"] == slo["ttft"] and stages["requests"] == 3
    assert good == {"slo": {f"{k}_ms": float(v) for k, v in slo.items()},
                    "requests": meeting, "share": meeting / 4, "per_s": float(meeting)}


def test_summarize_with_slo_puts_goodput_last(analysed):
    asm, attr = analysed.assembly, analysed.attribution
    summary = summarize(attr, request_values(asm, attr),
                        slo={"e2e": 2000, "ttft": 500}).to_dict()
    assert list(summary)[-2:] == ["load", "goodput"]
    assert summary["goodput"].pop("ttft_stages")["slo_ms"] == 500
    assert summary["goodput"] == {"slo": {"ttft_ms": 500.0, "e2e_ms": 2000.0},
                                  "requests": 3, "share": 0.75, "per_s": 3.0}


def test_bad_slos_are_refused(analysed):
    values = load_values(analysed.assembly, analysed.attribution)
    with pytest.raises(ValueError, match="unknown SLO metric 'latency'"):
        goodput(values, 1, {"latency": 5})
    with pytest.raises(ValueError, match="the ttft SLO must be a positive"):
        goodput(values, 1, {"ttft": 0})


def test_an_engine_only_trace_has_no_load_but_a_goodput_share():
    rows = []
    for t, sampled_ms in ((1, 5), (2, 30)):
        base = T0 + t * 100 * MS
        rows += [row(t, 10, "tokenize", base, base + MS),
                 event(t, 11, "first_sampled", base + sampled_ms * MS)]
    asm = assemble(table(rows))
    attr = attribute(asm)
    assert attr.boundary == "engine"
    summary = summarize(attr, request_values(asm, attr), slo={"ttft": 10})
    assert summary.load is None and "load" not in summary.to_dict()
    stages = summary.goodput.pop("ttft_stages")
    assert (stages["missing"], stages["smallest_set"]) == (1, None)  # the one stage is it
    assert summary.goodput == {"slo": {"ttft_ms": 10.0}, "requests": 1, "share": 0.5,
                               "per_s": None}
    assert load(load_values(asm, attr)) is None


def test_request_table_has_every_request_failed_ones_included(analysed):
    frame = request_table(analysed.assembly, analysed.attribution)
    assert list(frame["trace_id"]) == [tid(i) for i in (1, 2, 3, 4)]
    assert list(frame["outcome"]) == ["ok", "ok", "ok", "shed"]
    assert list(frame["status_code"]) == [200, 200, 200, 429]
    assert list(frame.columns) == [
        "trace_id", "request_id", "condition", "outcome", "status_code", "start_ns",
        "start_time", "start_offset_ms", "ttft_ms", "untraced_ms", "tpot_ms", "itl_ms",
        "e2e_ms", "prompt_tokens", "completion_tokens"]
    # each request's client span's start, the failed one's too, and from the first
    assert list(frame["start_ns"]) == [T0 + ms * MS for ms in (0, 50, 100, 300)]
    assert list(frame["start_time"]) == [
        f"2023-11-14T22:13:20.{ms:03d}000Z" for ms in (0, 50, 100, 300)]
    np.testing.assert_array_equal(frame["start_offset_ms"], [0.0, 50.0, 100.0, 300.0])
    np.testing.assert_array_equal(frame["ttft_ms"], [10.0, 40.0, 200.0, np.nan])
    # a client-only trace: no server window, so all of TTFT is untraced (not network)
    np.testing.assert_array_equal(frame["untraced_ms"], [10.0, 40.0, 200.0, np.nan])
    np.testing.assert_array_equal(frame["tpot_ms"], [5.0, 60.0, np.nan, np.nan])
    np.testing.assert_array_equal(frame["e2e_ms"], [100.0, 200.0, 300.0, 700.0])
    known = {key: [None if v is pd.NA else v for v in frame[key]]
             for key in ("prompt_tokens", "completion_tokens")}
    assert known == {"prompt_tokens": [12, None, None, None],
                     "completion_tokens": [5, None, 1, None]}


def test_a_dataset_in_partitions_gives_one_process_load_and_goodput():
    from ttft.collectors.synthetic import generate

    whole = generate(120, seed=3).table
    slo = {"ttft": 300, "tpot": 30, "e2e": 800}
    single = analyze(whole, slo=slo)
    for partitions in (2, 5):
        dataset = split(whole, partitions)
        parts_summary = in_partitions(dataset, None, "exclusive").summary
        assert parts_summary.load == single.summary.load
        merged = merge_with_slo(dataset, slo).summary
        assert merged.goodput == single.summary.goodput
        assert merged.to_dict() == single.summary.to_dict() | {"trace": merged.trace}


def merge_with_slo(dataset, slo):
    from ttft.analysis.clocks import offsets_from_bounds
    from ttft.analysis.part import analyze_part, merge, survey

    surveys = [survey(t) for t in dataset]
    offsets = offsets_from_bounds([s.bounds for s in surveys])
    parts = [analyze_part(t, offsets=offsets, boundary="client", policy="exclusive")
             for t in dataset]
    return merge(parts, offsets=offsets, metadata=surveys[0].metadata, slo=slo)
