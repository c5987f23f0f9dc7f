"""docs/grafana-dashboard.json reads only what the server exposes: every metric a query
names is on a real server's /metrics (scraped after one request, so the histograms have
samples), every panel is placed and has a query, and the model selector is the
``model_name`` label every metric carries."""

import json
import re
from pathlib import Path

import httpx
import pytest
from _live import running
from prometheus_client.parser import text_string_to_metric_families

from ttft.engine.server import build_engine, create_app

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana-dashboard.json"
MODEL = "tiny-test"
_SUFFIXES = ("_bucket", "_sum", "_count")


@pytest.fixture(scope="module")
def exposed(tmp_path_factory) -> dict[str, set[str]]:
    """Metric names of a live server's /metrics (with their sample names) → label names."""
    engine = build_engine("tiny", device="cpu",
                          tokenizer_cache_dir=str(tmp_path_factory.mktemp("tok")))
    with running(create_app(engine, model_name=MODEL)) as url:
        answer = httpx.post(f"{url}/v1/completions", timeout=60,
                            json={"model": MODEL, "prompt": "Once upon", "max_tokens": 4})
        answer.raise_for_status()
        VALUES["tokens"] = answer.json()["usage"]["completion_tokens"]
        text = httpx.get(f"{url}/metrics", timeout=60).text
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
            if sample.name.endswith("_count") or sample.name.startswith("ttft:num_"):
                VALUES[sample.name] = sample.value
    return out


VALUES: dict[str, float] = {}


def queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    found = [t["expr"] for p in board["panels"] for t in p["targets"]]
    found += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return found


def test_every_metric_a_query_names_is_exposed(exposed):
    named = {name for expr in queries() for name in re.findall(r"ttft:[A-Za-z0-9_:]+", expr)}
    assert named, "the dashboard names no metric"
    missing = sorted(name for name in named if name not in exposed)
    assert not missing, f"not on /metrics: {missing}"
    # histograms are read through their buckets; every histogram the server has is shown
    histograms = {n.removesuffix("_bucket") for n in exposed if n.endswith("_bucket")}
    shown = {n.removesuffix("_bucket") for n in named if n.endswith("_bucket")}
    assert shown == histograms


def test_every_exposed_metric_carries_the_model_name(exposed):
    unlabelled = sorted(n for n, labels in exposed.items()
                        if n.startswith("ttft:") and "model_name" not in labels)
    assert not unlabelled
    assert all('model_name=~"$model_name"' in expr for expr in queries()
               if not expr.startswith("label_values"))


def test_panels_are_placed_and_queried():
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"])
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
    for expr in queries():  # balanced brackets: a typo Grafana would only show at run time
        for opening, closing in ("()", "{}", "[]"):
            assert expr.count(opening) == expr.count(closing), expr


def test_one_request_is_in_the_token_histograms(exposed):
    """N tokens: one TPOT value (with two or more), N - 1 gaps; the engine idle after it."""
    tokens = VALUES["tokens"]
    assert VALUES["ttft:time_to_first_token_seconds_count"] == 1
    assert VALUES["ttft:time_per_output_token_seconds_count"] == (tokens >= 2)
    assert VALUES["ttft:inter_token_latency_seconds_count"] == tokens - 1
    assert VALUES["ttft:num_requests_running"] == VALUES["ttft:num_requests_waiting"] == 0
