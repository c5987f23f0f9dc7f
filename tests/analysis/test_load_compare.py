"""Whether two runs had the same load: offered load from the run metadata, the achieved
rate against its Poisson noise, the prompt-length mix by Kolmogorov-Smirnov."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ttft.analysis import analyze
from ttft.analysis.load_compare import ks_two_sample, load_checks, offered_load, prompt_tokens
from ttft.collectors.synthetic import generate


def _trace_meta(**arguments) -> dict:
    args = {"rate": None, "arrival": "poisson", "concurrency": None, "burst": None,
            "replay": None, "scale_time": 1.0, "output_tokens": 16}
    return {"command": "ttft trace", "arguments": {**args, **arguments}}


@pytest.fixture(scope="module")
def runs():
    return [generate(600, seed=s) for s in (1, 2)]


@pytest.fixture(scope="module")
def analyses(runs):
    return [analyze(r.table) for r in runs]


def test_offered_load_of_each_kind_of_run():
    assert offered_load(_trace_meta(rate=2.5)) == {"kind": "poisson", "rate_per_s": 2.5,
                                                   "output_tokens": 16}
    assert offered_load(_trace_meta(rate=1, arrival="constant"))["kind"] == "constant"
    assert offered_load(_trace_meta(concurrency=4))["concurrency"] == 4
    assert offered_load(_trace_meta(burst=50))["burst"] == 50
    assert offered_load(generate(10, seed=0).metadata) == {"kind": "poisson",
                                                           "rate_per_s": 20.0}
    assert offered_load({}) is None and offered_load(None) is None
    assert offered_load({"arguments": {"rate": 3}}) is None  # not a ttft command's


def test_two_seeds_of_one_workload_have_the_same_load(runs, analyses):
    checks = load_checks(tuple(r.metadata for r in runs), tuple(x.summary for x in analyses),
                         tuple(prompt_tokens(x.assembly) for x in analyses))
    assert [c["check"] for c in checks] == ["offered load", "achieved rate", "prompt tokens"]
    assert not any(c["differs"] for c in checks), checks


def test_a_different_rate_output_length_or_prompt_mix_differs(analyses):
    runs = analyses
    meta = (_trace_meta(rate=2.0, output_tokens=16), _trace_meta(rate=4.0, output_tokens=64))
    prompts = prompt_tokens(runs[0].assembly)
    checks = load_checks(meta, (runs[0].summary, runs[1].summary), (prompts, prompts * 2))
    got = {c["check"]: c for c in checks}
    assert got["offered load"]["differs"]
    assert got["offered load"]["a"] == "poisson arrivals at 2.00 requests/s"
    assert got["offered load"]["b"] == "poisson arrivals at 4.00 requests/s"
    assert got["max output tokens"]["differs"]
    assert (got["max output tokens"]["a"], got["max output tokens"]["b"]) == ("16", "64")
    assert got["prompt tokens"]["differs"]
    assert "Kolmogorov-Smirnov D" in got["prompt tokens"]["why"]
    assert not got["achieved rate"]["differs"]
    # within 1 %: the same rate
    same = load_checks((_trace_meta(rate=2.0), _trace_meta(rate=2.01)),
                       (runs[0].summary, runs[1].summary))
    assert not same[0]["differs"]


def test_an_achieved_rate_beyond_its_noise_differs(analyses):
    a = analyses[0].summary
    half = replace(a, load={**a.load, "requests_per_s": a.load["requests_per_s"] / 2})
    near = replace(a, load={**a.load, "requests_per_s": a.load["requests_per_s"] * 0.95})
    assert load_checks(({}, {}), (a, half))[0]["differs"]
    assert not load_checks(({}, {}), (a, near))[0]["differs"]
    # two closed loops of one concurrency: their rate follows from their latency
    loops = (_trace_meta(concurrency=4), _trace_meta(concurrency=4))
    assert [c["check"] for c in load_checks(loops, (a, half))] == [
        "offered load", "max output tokens"]


def test_ks_two_sample_matches_the_definition():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=400), rng.normal(0.5, size=300)
    d, p = ks_two_sample(x, y)
    grid = np.sort(np.concatenate([x, y]))
    cdf = [np.searchsorted(np.sort(v), grid, "right") / len(v) for v in (x, y)]
    assert d == pytest.approx(np.abs(cdf[0] - cdf[1]).max())
    assert p < 1e-6
    d_same, p_same = ks_two_sample(x, rng.normal(size=500))
    assert d_same < 0.1 and p_same > 0.01
    assert ks_two_sample(x, x) == (0.0, 1.0)
