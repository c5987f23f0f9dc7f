"""Summaries: percentiles with zeros included, share, raw and overlap, conditions, tail."""

from __future__ import annotations

import numpy as np
import pytest
from _build import event, row, table

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.analysis.request_values import request_values
from ttft.analysis.summary import BANDS, percentile_bands, stage_table, summarize
from ttft.collectors.synthetic import generate

CLIENT = {"clock": "client", "service": "loadgen"}


def request(t: int, queue_ms: int, cached: int, tokens: list[int]) -> list[dict]:
    """Server [0, queue+2ms) with a queue then a 2 ms chunk; client tokens at given ms."""
    ms = 1_000_000
    base = t * 10_000 * ms
    rows = [
        row(t, t * 100 + 1, "client", base, base + 100 * ms, **CLIENT),
        row(
            t, t * 100 + 2, "server", base, base + 50 * ms, parent=t * 100 + 1, cached_tokens=cached
        ),
        row(t, t * 100 + 3, "queue", base, base + queue_ms * ms, parent=t * 100 + 2),
        row(
            t,
            t * 100 + 4,
            "prefill.chunk",
            base + queue_ms * ms,
            base + (queue_ms + 2) * ms,
            parent=t * 100 + 2,
        ),
        event(t, t * 100 + 5, "first_byte", base + (queue_ms + 2) * ms),
    ]
    for i, when in enumerate(tokens):
        name = "first_token" if i == 0 else "token"
        rows.append(event(t, t * 100 + 10 + i, name, base + when * ms, **CLIENT))
    return rows


@pytest.fixture
def summary():
    rows = (
        request(1, 0, 0, [2, 4, 6])  # cold, no queue
        + request(2, 8, 0, [10, 13])  # cold
        + request(3, 18, 64, [20, 21, 22])  # prefix hit
    )
    asm = assemble(table(rows))
    return summarize(attr := attribute(asm, "client", "exclusive"), request_values(asm, attr),
                     trace="t.parquet").to_dict()


def test_overall_stage_figures(summary):
    assert summary["boundary"] == "client" and summary["requests"] == 3
    assert summary["ttft_ms"]["p50"] == pytest.approx(10.0)
    assert summary["ttft_ms"]["mean"] == pytest.approx(32 / 3)
    queue = summary["stages"]["queue"]
    # zeros included: queue times 0, 8, 18 ms
    assert queue["p50"] == pytest.approx(8.0)
    assert queue["p90"] == pytest.approx(np.percentile([0, 8, 18], 90))
    assert queue["share"] == pytest.approx(26 / 32)
    assert queue["overlap_mean"] == 0.0
    server = summary["stages"]["server"]
    assert server["mean"] == 0.0
    assert server["raw_mean"] == pytest.approx(32 / 3)
    assert server["overlap_mean"] == pytest.approx(32 / 3)
    assert sum(s["share"] for s in summary["stages"].values()) == pytest.approx(1.0)


def test_conditions_are_separate(summary):
    assert set(summary["conditions"]) == {"cold", "prefix_hit"}
    cold = summary["conditions"]["cold"]
    assert cold["requests"] == 2
    assert cold["ttft_ms"]["mean"] == pytest.approx(6.0)
    assert cold["stages"]["queue"]["share"] == pytest.approx(8 / 12)
    assert summary["conditions"]["prefix_hit"]["stages"]["queue"]["mean"] == pytest.approx(18)


def test_inter_token_latency(summary):
    gaps = [2, 2, 3, 1, 1]  # pooled over every request's consecutive chunks
    assert summary["chunk_gap_ms"]["p50"] == pytest.approx(np.percentile(gaps, 50))
    assert summary["chunk_gap_ms"]["mean"] == pytest.approx(np.mean(gaps))
    per_request = [2, 3, 1]  # each request's mean gap: percentiles over requests
    assert summary["itl_ms"]["mean"] == pytest.approx(np.mean(per_request))
    assert summary["itl_ms"]["p50"] == pytest.approx(np.percentile(per_request, 50))
    assert summary["itl_ms"]["requests"] == 3
    # no usage in these traces: tokens are the chunks, so TPOT equals ITL
    assert summary["tpot_ms"] == summary["itl_ms"]


def test_tail_against_middle(summary):
    tail = summary["tail"]
    assert tail["queue"]["tail_mean"] == pytest.approx(np.mean([18]))
    # p40..p60 of TTFT (2, 10, 20 ms) keeps only the 10 ms request
    assert tail["queue"]["median_mean"] == pytest.approx(8.0)


def test_stage_entry_shape(summary):
    # the top-level shape is checked through the CLI (tests/reports/test_cli.py)
    assert set(summary["stages"]["queue"]) == {
        "p50",
        "p90",
        "p99",
        "mean",
        "share",
        "raw_mean",
        "overlap_mean",
    }


def test_empty_selection_gives_empty_table():
    asm = assemble(table(request(1, 0, 0, [2])))
    result = attribute(asm, "client")
    assert stage_table(result, np.zeros(1, bool)).empty


def test_percentile_bands_stack_to_their_mean_ttft():
    attr = attribute(assemble(generate(1000, seed=5).table))
    bands = percentile_bands(attr)
    assert list(bands.index) == list(BANDS)
    ttft_ms = attr.requests["ttft_ns"].to_numpy() / 1e6
    stages = bands.drop(columns=["requests", "ttft_ms"])
    np.testing.assert_allclose(stages.sum(axis=1), bands["ttft_ms"], rtol=1e-12)
    # p50 band: the requests between TTFT's p47.5 and p52.5, averaged.
    lo, hi = np.percentile(ttft_ms, [47.5, 52.5])
    inside = (ttft_ms >= lo) & (ttft_ms <= hi)
    assert bands.loc["p50", "requests"] == inside.sum() == 50
    assert bands.loc["p50", "ttft_ms"] == pytest.approx(ttft_ms[inside].mean())
    # The tail: TTFT at or above p99.
    assert bands.loc["tail ≥ p99", "requests"] == (ttft_ms >= np.percentile(ttft_ms, 99)).sum()
    assert bands["ttft_ms"].is_monotonic_increasing


def test_percentile_bands_of_few_requests_use_the_nearest():
    attr = attribute(assemble(generate(3, seed=1).table))
    bands = percentile_bands(attr)
    assert (bands["requests"] >= 1).all()
    ttft_ms = np.sort(attr.requests["ttft_ns"].to_numpy() / 1e6)
    assert bands.loc["p50", "ttft_ms"] == pytest.approx(ttft_ms[1])
    mask = np.zeros(3, bool)
    assert percentile_bands(attr, mask).empty


def test_tpot_uses_usage_tokens_and_second_and_reasoning_tokens_are_timed():
    ms = 1_000_000
    rows = request(1, 0, 0, [2, 4, 6]) + request(2, 0, 0, [30, 31])
    rows[0] = row(1, 101, "client", 10_000 * ms, 10_100 * ms, completion_tokens=5, **CLIENT)
    rows.append(event(1, 150, "first_reasoning", 10_000 * ms + ms, **CLIENT))
    asm = assemble(table(rows))
    attr = attribute(asm, "client", "exclusive")
    out = summarize(attr, request_values(asm, attr)).to_dict()
    # request 1: 4 ms from first to last chunk over 5 - 1 tokens; request 2: 1 ms, 2 chunks
    assert (out["tpot_ms"]["p50"], out["tpot_ms"]["requests"]) == (pytest.approx(1.0), 2)
    assert out["itl_ms"]["mean"] == pytest.approx((2 + 1) / 2)
    assert out["ttst_ms"]["mean"] == pytest.approx((4 + 31) / 2)  # second chunk, from start
    assert (out["ttfrt_ms"]["mean"], out["ttfrt_ms"]["requests"]) == (pytest.approx(1.0), 1)


def test_stage_percentiles_cut_each_part_s_matrix_once_a_pass(monkeypatch):
    """``stage_rows`` over three parts: each part's stage matrix is made once per pass of
    each batch of columns (``part_figures.EachPart``), not once per column, and the
    figures are numpy's over the stacked requests."""
    from ttft.analysis import order_stats, part_figures
    from ttft.analysis.part_figures import PartRows, stage_rows

    attrs = []
    for seed in (1, 2, 3):
        asm = assemble(generate(40, seed=seed).table)
        attrs.append(attribute(asm, "client", "exclusive"))
    made = []
    real = part_figures.stage_matrix
    monkeypatch.setattr(part_figures, "stage_matrix",
                        lambda *args, **kw: made.append(1) or real(*args, **kw))
    parts = order_stats.InMemory([PartRows(a, None) for a in attrs])
    table = stage_rows(parts)
    batches = -(-len(table) // order_stats.HELD_BATCH)
    assert len(made) == len(attrs) * batches
    stacked = np.concatenate([a.attributed.to_numpy(np.int64) for a in attrs])
    columns = list(attrs[0].attributed.columns)
    for stage, figures in table.iterrows():
        want = np.percentile(stacked[:, columns.index(stage)] / 1e6, [50, 90, 99])
        assert figures[["p50", "p90", "p99"]].to_numpy().tobytes() == want.tobytes()
