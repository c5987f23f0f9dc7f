"""Sampling: greedy is argmax, seeds reproduce, top_p narrows, temperature spreads to the
softmax, and bad parameters are refused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ttft.engine.sampler import (
    SamplingError,
    SamplingParams,
    make_generator,
    sample,
    sample_batch,
)


def logits_row(seed: int, vocab: int = 64) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed))


def draws(logits: torch.Tensor, params: SamplingParams, n: int) -> list[int]:
    gen = make_generator(params)
    return [sample(logits, params, gen) for _ in range(n)]


def test_greedy_is_argmax():
    for seed in range(5):
        logits = logits_row(seed)
        assert sample(logits, SamplingParams()) == int(logits.argmax())
    tie = torch.tensor([0.0, 3.0, 3.0, 1.0])
    assert sample(tie, SamplingParams()) == 1


def test_greedy_batch_is_rowwise_argmax():
    logits = torch.stack([logits_row(s) for s in range(3)])  # (B, V)
    params = [SamplingParams()] * 3
    assert sample_batch(logits, params, [None] * 3) == logits.argmax(-1).tolist()


def test_same_seed_same_tokens_different_seeds_differ():
    logits = logits_row(0)
    a = draws(logits, SamplingParams(temperature=1.0, seed=7), 20)
    b = draws(logits, SamplingParams(temperature=1.0, seed=7), 20)
    c = draws(logits, SamplingParams(temperature=1.0, seed=8), 20)
    assert a == b
    assert a != c


def test_seeded_rows_do_not_depend_on_batch_neighbours():
    logits = logits_row(1)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=3)
    alone = draws(logits, params, 10)
    gens = [make_generator(params), make_generator(SamplingParams(temperature=1.0, seed=99))]
    batched = [
        sample_batch(torch.stack([logits, logits_row(2)]), [params, params], gens)[0]
        for _ in range(10)
    ]
    assert batched == alone


def test_tiny_top_p_always_picks_the_argmax():
    logits = logits_row(2)
    params = SamplingParams(temperature=1.5, top_p=1e-6, seed=0)
    assert set(draws(logits, params, 200)) == {int(logits.argmax())}


def test_top_p_keeps_the_smallest_set_reaching_the_mass_renormalized():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    params = SamplingParams(temperature=1.0, top_p=0.7, seed=1)
    out = draws(probs.log(), params, 2000)
    assert set(out) == {0, 1}  # 0.5 < 0.7 <= 0.5 + 0.3
    assert out.count(0) / len(out) == pytest.approx(0.5 / 0.8, abs=0.04)


def test_high_temperature_spreads_like_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -2.0])
    params = SamplingParams(temperature=3.0, seed=2)
    n = 2000
    counts = torch.bincount(torch.tensor(draws(logits, params, n)), minlength=5)
    expected = torch.softmax(logits / 3.0, dim=-1)
    assert (counts > 0).all()
    assert torch.allclose(counts.float() / n, expected, atol=0.04)


@given(
    st.lists(st.floats(-20, 20, allow_nan=False), min_size=1, max_size=32),
    st.floats(0.01, 5.0),
    st.floats(1e-6, 1.0),
    st.integers(0, 2**31),
)
def test_sampled_token_is_in_the_nucleus(values, temperature, top_p, seed):
    logits = torch.tensor(values)
    params = SamplingParams(temperature=temperature, top_p=top_p, seed=seed)
    token = sample(logits, params, make_generator(params))
    probs = torch.softmax(logits / temperature, dim=-1)
    # Every token strictly more likely than the pick fits in a mass short of top_p.
    assert 0 <= token < len(values)
    assert float(probs[probs > probs[token]].sum()) < top_p + 1e-5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=-0.1), "temperature must be >= 0"),
        (dict(temperature=float("nan")), "temperature must be a finite number"),
        (dict(top_p=0.0), r"top_p must be in \[1e-06, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \[1e-06, 1\]"),
        (dict(top_p=1e-300), r"top_p must be in \[1e-06, 1\]"),
        (dict(top_p=float("nan")), r"top_p must be in \[1e-06, 1\]"),
        (dict(temperature=1e-300), r"temperature must be 0 \(greedy\) or at least 1e-06"),
        (dict(seed=1.5), "seed must be an int or None"),
    ],
)
def test_invalid_params_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"one row of logits"):
        sample(torch.zeros(2, 3), SamplingParams())
    with pytest.raises(ValueError, match="one of each per row"):
        sample_batch(torch.zeros(2, 3), [SamplingParams()], [None, None])


def test_tiny_temperature_keeps_the_top_token_and_bad_logits_fail_alone():
    logits = torch.tensor([0.0, 3.0, 1.0])
    params = SamplingParams(temperature=1e-6, seed=0)
    assert sample(logits, params, make_generator(params)) == 1
    with pytest.raises(SamplingError, match="not finite"):
        sample(torch.tensor([0.0, float("nan")]), params, make_generator(params))
