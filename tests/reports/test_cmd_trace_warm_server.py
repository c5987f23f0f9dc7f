"""A second `ttft trace` against a warm server: fresh prompts unless ``--seed`` repeats
them, and a warning when a cold workload comes back with cached prompt tokens."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from ttft.collectors import read_spans, run_metadata
from ttft.engine.server import build_engine, serving
from ttft.reports.cli import app

runner = CliRunner()
WARNING = "requests of a cold workload came back with cached prompt tokens"


@pytest.fixture
def server_url(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("tokenizer"))
    with serving(build_engine("tiny", device="cpu", tokenizer_cache_dir=cache),
                 model_name="tiny") as url:
        yield url


def _trace(url: str, out, *seed: str):
    result = runner.invoke(app, [
        "trace", url, "--concurrency", "1", "--requests", "3", "--prompt-tokens", "64",
        "--output-tokens", "2", "--warmup", "0", "--receiver-port", "0", "--span-wait", "0.2",
        "-o", str(out), *seed,
    ])
    assert result.exit_code == 0, result.output
    table = read_spans(out)
    clients = table.filter(pc.equal(table.column("stage"), "client"))
    cached = [json.loads(a)["cached_tokens"] for a in clients.column("attributes").to_pylist()]
    return result.stderr, cached, run_metadata(table)["arguments"]["seed"]


def test_runs_without_a_seed_send_fresh_prompts(server_url, tmp_path):
    first_err, first, first_seed = _trace(server_url, tmp_path / "a.parquet")
    second_err, second, second_seed = _trace(server_url, tmp_path / "b.parquet")
    assert first_seed != second_seed and isinstance(first_seed, int)
    assert first == second == [0, 0, 0]
    assert WARNING not in first_err + second_err


def test_a_repeated_seed_on_a_warm_server_is_named_as_cached(server_url, tmp_path):
    first_err, first, _ = _trace(server_url, tmp_path / "a.parquet", "--seed", "7")
    second_err, second, seed = _trace(server_url, tmp_path / "b.parquet", "--seed", "7")
    assert first == [0, 0, 0] and WARNING not in first_err
    assert seed == 7 and all(n > 0 for n in second)
    last = second_err.strip().splitlines()[-1]
    assert last == f"3 of 3 {WARNING}: the server had seen these prompts (seed 7) before; " \
                   "this is not a cold run"
