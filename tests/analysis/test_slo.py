"""SLO attribution (analysis/slo.py): rescue shares and the smallest set of stages, on
hand-built per-request parts whose answers are known, and a brute-force check of the
search on random parts."""

from itertools import combinations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ttft.analysis.slo as slo_module
from ttft.analysis.attribution import Attribution
from ttft.analysis.quality import Quality
from ttft.analysis.slo import slo_attribution

MS = 1_000_000


def parts(stages: dict[str, list[int]], conditions: list[str | None] | None = None
          ) -> Attribution:
    """An attribution whose requests have exactly these attributed ms per stage."""
    frame = pd.DataFrame({name: np.asarray(ms, np.int64) * MS for name, ms in stages.items()})
    n = len(frame)
    requests = pd.DataFrame({
        "trace_id": [f"{i:032x}" for i in range(n)], "request_id": [None] * n,
        "condition": conditions or [None] * n, "a_ns": np.zeros(n, np.int64),
        "ttft_ns": frame.sum(axis=1).to_numpy(np.int64), "request": np.arange(n)})
    return Attribution("client", "exclusive", requests, frame, frame.copy(), frame.copy(),
                       Quality())


def test_rescue_shares_and_the_smallest_set_on_known_parts():
    # medians: queue 10, prefill 50. Requests 3 (170 ms) and 4 (190 ms) miss a 100 ms SLO:
    # request 3 is rescued by its queue alone (10 + 50), request 4 by no single stage
    # (queue: 10 + 100 = 110, prefill: 90 + 50 = 140), only by both (p99 is near 190).
    attr = parts({"queue": [10, 10, 10, 120, 90], "prefill": [50, 50, 40, 50, 100]})
    out = slo_attribution(attr, 100)
    assert (out["requests"], out["missing"]) == (5, 2)
    assert out["stages"] == {"queue": {"rescued": 1, "share": 0.5},
                             "prefill": {"rescued": 0, "share": 0.0}}
    assert out["smallest_set"] == ["queue", "prefill"]
    assert out["p99_after_ms"] <= 100 < out["p99_ms"]


def test_the_median_is_of_the_requests_condition():
    # prefix hits queue 5 ms, cold requests 60 ms: a slow cold request is measured against
    # the cold median, so cutting its queue to that median does not rescue it.
    attr = parts({"queue": [5, 5, 5, 60, 60, 90], "prefill": [20, 20, 20, 40, 40, 40]},
                 ["prefix_hit"] * 3 + ["cold"] * 3)
    out = slo_attribution(attr, 100)
    assert out["missing"] == 1  # the 130 ms cold one
    assert out["stages"]["queue"]["rescued"] == 1  # 130 - 90 + 60 = 100 <= 100
    attr = parts({"queue": [5, 5, 5, 80, 80, 90], "prefill": [20, 20, 20, 40, 40, 40]},
                 ["prefix_hit"] * 3 + ["cold"] * 3)
    out = slo_attribution(attr, 100)
    assert out["missing"] == 3 and out["stages"]["queue"]["rescued"] == 0


def test_met_already_and_never_met():
    attr = parts({"queue": [10, 20, 30]})
    assert slo_attribution(attr, 1000)["smallest_set"] == []
    far = slo_attribution(parts({"queue": [500, 500, 500]}), 100)  # median is 500 too
    assert far["smallest_set"] is None and far["missing"] == 3
    empty = parts({"queue": []})
    assert slo_attribution(empty, 100) is None


def test_past_the_exhaustive_budget_the_search_is_greedy_and_says_so(monkeypatch):
    attr = parts({"queue": [10, 10, 10, 200], "prefill": [50, 50, 50, 50],
                  "gpu": [5, 5, 5, 100]})
    monkeypatch.setattr(slo_module, "MAX_EXHAUSTIVE", 1)
    out = slo_attribution(attr, 100)
    assert out["search"] == "greedy" and out["p99_after_ms"] <= 100
    assert set(out["smallest_set"]) <= {"queue", "prefill", "gpu"}


def _p99_after(ttft, cut, chosen):
    return np.percentile(ttft - cut[:, list(chosen)].sum(axis=1), 99) if chosen else \
        np.percentile(ttft, 99)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 200), min_size=3, max_size=3), min_size=3,
                max_size=30), st.integers(20, 400))
def test_the_set_found_is_a_smallest_one(rows, slo_ms):
    ms = np.asarray(rows)
    attr = parts({"a": ms[:, 0], "b": ms[:, 1], "c": ms[:, 2]})
    out = slo_attribution(attr, slo_ms)
    if out is None or out["smallest_set"] is None:
        return
    used = [n for n in ("a", "b", "c") if n in out["stages"]]
    att = attr.attributed[used].to_numpy(np.int64)
    cut = np.maximum(att - np.median(att, axis=0), 0)
    ttft = attr.requests["ttft_ns"].to_numpy(np.int64)
    index = [used.index(n) for n in out["smallest_set"]]
    assert _p99_after(ttft, cut, index) <= slo_ms * MS
    for size in range(len(index)):
        for smaller in combinations(range(len(used)), size):
            assert _p99_after(ttft, cut, smaller) > slo_ms * MS


@pytest.mark.parametrize("slo_ms", [1, 100])
def test_shares_add_up_per_stage_over_missing_requests(slo_ms):
    attr = parts({"queue": [1, 2, 3, 400], "prefill": [300, 2, 3, 4]})
    out = slo_attribution(attr, slo_ms)
    for stage in out["stages"].values():
        assert 0 <= stage["rescued"] <= out["missing"]
