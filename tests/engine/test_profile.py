"""``measure_prefill`` on the tiny model: the timed runs it returns (cases, rounds, chunks
with the engine's chunk facts, host-clock intervals) and the model and measured device it
reports."""

from __future__ import annotations

import pytest

from ttft.engine.model import ModelConfig
from ttft.engine.profile import ProfileSpec, measure_prefill


@pytest.fixture(scope="module")
def profile():
    spec = ProfileSpec(model="tiny", lengths=(32, 64), chunk_sizes=(16, 64), prefix_reuse=True,
                       repeats=2, warmup=1)  # fmt: skip
    steps: list[str] = []
    return measure_prefill(spec, on_step=steps.append), steps


def test_every_case_runs_once_per_round_in_turn(profile):
    result, steps = profile
    cases = [(r.length, r.condition, r.chunk_size, r.cached_tokens) for r in result.runs]
    per_length = {
        32: [(32, "cold", 16, 0), (32, "cold", 32, 0), (32, "prefix_hit", 16, 16)],
        64: [(64, "cold", 16, 0), (64, "cold", 64, 0),
             (64, "prefix_hit", 16, 32), (64, "prefix_hit", 32, 32)],
    }  # fmt: skip
    assert cases == [case for n in (32, 64) for _ in range(2) for case in per_length[n]]
    assert [r.repeat for r in result.runs[:6]] == [0, 0, 0, 1, 1, 1]
    assert steps == ["length 32: 3 case(s)", "length 64: 4 case(s)"]


def test_chunks_carry_the_engine_chunk_facts_and_host_intervals(profile):
    result, _ = profile
    for run in result.runs:
        tokens = [c.chunk_tokens for c in run.chunks]
        left = run.length - run.cached_tokens
        assert sum(tokens) == left and all(0 < n <= run.chunk_size for n in tokens)
        assert {c.cached_tokens for c in run.chunks} == {run.cached_tokens}
        context = [c.context_tokens for c in run.chunks]
        assert context[-1] == run.length and context == sorted(context)
        assert all(c.end_ns > c.start_ns for c in run.chunks)
        ends = [c.end_ns for c in run.chunks]
        assert all(a <= b.start_ns for a, b in zip(ends, run.chunks[1:], strict=False))


def test_reports_the_model_config_and_the_measured_device(profile):
    result, _ = profile
    tiny = ModelConfig.preset("tiny")
    assert result.model_config["n_layer"] == tiny.n_layer
    assert result.model_config["dtype"] == "float32"
    assert result.device["type"] == "cpu" and result.device["peaks_source"] == "measured"
    assert result.device["peak_flops_per_s"] > 0 and result.threads >= 1
    assert result.spec.lengths == (32, 64)


def test_a_bad_spec_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="exceed the tiny model's max_seq_len 512"):
        measure_prefill(ProfileSpec(model="tiny", lengths=(1024,)))
