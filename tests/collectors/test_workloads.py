"""Workloads: arrival patterns, generated and shared-prefix prompts, replay parsing, and
exact prompt lengths through a real server's ``/tokenize`` (the tiny reference model over
loopback)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import numpy as np
import pytest
from _live import running
from starlette.applications import Starlette

from ttft.collectors.workloads import (
    burst,
    constant,
    fit_to_server,
    generated_prompts,
    poisson,
    read_replay,
)
from ttft.engine.server import build_engine, create_app

MODEL = "tiny"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return build_engine(
        "tiny", device="cpu", tokenizer_cache_dir=str(tmp_path_factory.mktemp("tokenizer"))
    )


def test_arrival_patterns_are_seeded_monotone_and_at_rate():
    a, b = poisson(50.0, 20_000, seed=7), poisson(50.0, 20_000, seed=7)
    assert a == b and a != poisson(50.0, 20_000, seed=8)
    assert a[0] == 0.0 and all(np.diff(a) >= 0)
    assert len(a) / a[-1] == pytest.approx(50.0, rel=0.03)
    assert constant(4.0, 5) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert burst(3) == [0.0, 0.0, 0.0] and poisson(1.0, 0) == []
    with pytest.raises(ValueError):
        poisson(0.0, 3)


MOONCAKE = [
    {"timestamp": 0, "input_length": 1200, "output_length": 20, "hash_ids": [1, 2, 3]},
    {"timestamp": 500, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2, 4]},
    {"timestamp": 1500, "input_length": 300, "output_length": 5, "hash_ids": [9]},
    {"timestamp": 2000, "input_length": 600, "output_length": 40},
    {"timestamp": 3000, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
]


def test_read_replay_scales_and_shares_prefixes(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in MOONCAKE))
    items = read_replay(path, scale_tokens=0.1, scale_time=0.5)
    assert [it.arrival_s for it in items] == [0.0, 0.25, 0.75, 1.0, 1.5]
    assert [len(it.prompt.split()) for it in items] == [120, 110, 30, 60, 102]
    assert [it.max_tokens for it in items] == [2, 1, 1, 4, 1]
    assert [it.group for it in items] == ["1", "1", "9", None, "1"]
    words = [it.prompt.split() for it in items]
    assert words[0][:102] == words[1][:102] == words[4]  # blocks 1 and 2 (51 words each)
    assert words[0][102:] != words[1][102:108]
    assert items == read_replay(path, scale_tokens=0.1, scale_time=0.5)  # deterministic
    assert len(read_replay(path, limit=2)) == 2

    csv_path = tmp_path / "trace.csv"
    csv_path.write_text(
        "timestamp,input_length,output_length,hash_ids\n"
        '0,1200,20,"[1, 2, 3]"\n500,1100,10,"[1, 2, 4]"\n'
    )
    assert read_replay(csv_path, scale_tokens=0.1) == [
        replace(it, arrival_s=it.arrival_s * 2) for it in items[:2]
    ]
    assert [it.target_tokens for it in items] == [120, 110, 30, 60, 102]
    assert [it.prompt[: it.shared_chars].split() for it in items][:3] == [
        words[0][:120], words[1][:110], words[2]
    ]  # the hash blocks are the shared part; row 4 has none
    assert items[3].shared_chars == 0


def test_read_replay_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    rows = [json.dumps(row) for row in MOONCAKE[:2]]
    path.write_text("\n".join([*rows, '{"timestamp": 1, "output_length": 3}']) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: missing column 'input_length'"):
        read_replay(path)
    path.write_text(rows[0] + "\nnot json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not a JSON object"):
        read_replay(path)
    path.write_text('{"timestamp": 0, "input_length": "x", "output_length": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: bad row"):
        read_replay(path)


def test_generated_prompts_have_the_asked_lengths_and_share_prefixes():
    offsets = constant(10.0, 60)
    plain = generated_prompts(offsets, prompt_tokens=(20, 40), max_tokens=8, seed=3)
    assert [it.arrival_s for it in plain] == offsets
    assert all(20 <= len(it.prompt.split()) == it.target_tokens <= 40 for it in plain)
    assert len({it.prompt for it in plain}) == 60 and plain == generated_prompts(
        offsets, prompt_tokens=(20, 40), max_tokens=8, seed=3
    )
    shared = generated_prompts(offsets, prompt_tokens=(30, 30), max_tokens=8, shared_prefix=(3, 4),
                       prefix_tokens=12, seed=3)
    assert {it.group for it in shared} == {"prefix-0", "prefix-1", "prefix-2"}
    assert len({it.prompt for it in shared}) == 12  # P x S distinct prompts, then repeats
    for group in {it.group for it in shared}:
        members = [it for it in shared if it.group == group]
        heads = {it.prompt[: it.shared_chars] for it in members}
        assert len(heads) == 1 and len(heads.pop().split()) == 12
        assert len({it.prompt for it in members}) == 4
    mixed = generated_prompts(constant(10.0, 400), prompt_tokens=(30, 30), max_tokens=8,
                      shared_prefix=(3, 4), shared_fraction=0.25, seed=3)
    assert sum(it.group is not None for it in mixed) == pytest.approx(100, abs=30)
    assert all(it.shared_chars == 0 for it in mixed if it.group is None)
    with pytest.raises(ValueError, match="prefix tokens"):
        generated_prompts(offsets, prompt_tokens=(10, 20), max_tokens=1, shared_prefix=(2, 2),
                  prefix_tokens=10)
    with pytest.raises(ValueError, match="prompt tokens"):
        generated_prompts(offsets, prompt_tokens=(20, 10), max_tokens=1)


def test_fit_to_server_makes_prompts_exact_and_keeps_shared_prefixes(engine):
    items = generated_prompts(constant(10.0, 12), prompt_tokens=(15, 60), max_tokens=4,
                      shared_prefix=(2, 3), prefix_tokens=10, seed=1)
    with running(create_app(engine, model_name=MODEL)) as url:
        fitted = asyncio.run(fit_to_server(url, items, model=MODEL))
    assert fitted is not None and all(it.exact for it in fitted)
    counts = [len(engine.tokenizer.encode(it.prompt)) for it in fitted]
    assert counts == [it.target_tokens for it in items]
    for before, after in zip(items, fitted, strict=True):
        assert after.prompt[: after.shared_chars] == before.prompt[: before.shared_chars]
        assert after.group == before.group and after.arrival_s == before.arrival_s


def test_fit_to_server_without_tokenize_leaves_prompts_approximate():
    items = generated_prompts([0.0], prompt_tokens=(5, 5), max_tokens=1)
    with running(Starlette()) as url:  # every path is 404
        assert asyncio.run(fit_to_server(url, items)) is None
