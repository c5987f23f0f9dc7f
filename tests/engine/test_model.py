"""The reference model: attend's offset causal mask (toy example, naive reference, GQA),
chunked prefill == whole prefill, batched decode == per-sequence decode, presets, seeds."""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from ttft.engine.kv_cache import CacheFull, PagedKVCache, Seq
from ttft.engine.model import (
    ModelConfig,
    Transformer,
    attend,
    decode_step,
    greedy,
    prefill,
    prefill_chunk,
)


@pytest.fixture(scope="module")
def tiny() -> Transformer:
    return Transformer.from_config(ModelConfig.preset("tiny"), seed=0)


def prompt(seed: int, n: int, vocab: int = 512) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# -- attend --------------------------------------------------------------------------------


def test_attend_toy_example_whole_and_in_two_chunks():
    ones = torch.ones(1, 1, 4, 1, dtype=torch.float64)  # (B, H, T, D): one head of dim 1
    v = torch.tensor([2.0, 4.0, 8.0, 10.0], dtype=torch.float64).view(1, 1, 4, 1)
    expected = torch.tensor([2.0, 3.0, 14 / 3, 6.0], dtype=torch.float64)

    whole = attend(ones, ones, v, q_start=0)
    first = attend(ones[:, :, :2], ones[:, :, :2], v[:, :, :2], q_start=0)
    second = attend(ones[:, :, 2:], ones, v, q_start=2)  # first two K/V are the cached prefix

    torch.testing.assert_close(whole.flatten(), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        torch.cat([first, second], 2).flatten(), expected, rtol=0, atol=1e-12
    )


def naive_attend(q, k, v, q_start):
    n_rep = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    for i in range(q.size(2)):
        scores[:, :, i, q_start + i + 1 :] = float("-inf")
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize(
    "B, H, H_kv, Tq, q_start, D",
    [(1, 1, 1, 5, 0, 4), (2, 4, 2, 3, 7, 8), (3, 6, 1, 1, 9, 16), (2, 4, 4, 6, 2, 8)],
)
def test_attend_matches_naive_masked_softmax(B, H, H_kv, Tq, q_start, D):
    gen = torch.Generator().manual_seed(B * 100 + Tq * 10 + q_start)
    q = torch.randn(B, H, Tq, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, H_kv, q_start + Tq, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H_kv, q_start + Tq, D, generator=gen, dtype=torch.float64)
    out = attend(q, k, v, q_start)
    assert out.shape == (B, H, Tq, D)
    torch.testing.assert_close(out, naive_attend(q, k, v, q_start), rtol=0, atol=1e-10)


def test_attend_rejects_keys_that_do_not_match_q_start():
    q, kv = torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 5, 4)
    with pytest.raises(ValueError, match="expected 4 keys"):
        attend(q, kv, kv, q_start=2)


# -- prefill and decode --------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_chunked_prefill_equals_whole_prefill(tiny, seed):
    cache = PagedKVCache.for_model(tiny, num_blocks=64, block_size=16)
    tokens = prompt(seed, 100)
    whole = prefill(tiny, cache, tokens)
    expected = greedy(tiny, cache, tokens, 8)
    assert whole.dtype == torch.float32 and whole.shape == (tiny.config.vocab_size,)
    for chunk_size in [1, 7, 64]:
        logits = prefill(tiny, cache, tokens, chunk_size)
        torch.testing.assert_close(logits, whole, rtol=0, atol=1e-5)
        assert greedy(tiny, cache, tokens, 8, chunk_size) == expected
    assert cache.blocks_in_use() == 0


def test_prefill_chunk_continues_from_the_cached_prefix(tiny):
    cache = PagedKVCache.for_model(tiny, num_blocks=16, block_size=8)
    tokens = prompt(3, 50)
    whole = prefill(tiny, cache, tokens)
    seq = cache.allocate()
    for a, b in [(0, 5), (5, 35), (35, 36), (36, 50)]:  # uneven chunks, across block edges
        logits = prefill_chunk(tiny, cache, seq, tokens[a:b])
        assert seq.length == b
    torch.testing.assert_close(logits, whole, rtol=0, atol=1e-5)
    assert len(seq.blocks) == 7


def test_batched_decode_equals_per_sequence_decode(tiny):
    cache = PagedKVCache.for_model(tiny, num_blocks=32, block_size=4)
    prompts = [prompt(4, 10), prompt(5, 37), prompt(6, 1)]
    next_ids = [3, 141, 59]

    alone = []
    for p, t in zip(prompts, next_ids, strict=True):
        seq = cache.allocate()
        prefill(tiny, cache, p, seq=seq)
        alone.append(decode_step(tiny, cache, [seq], [t])[0])
        cache.free(seq)

    seqs = [cache.allocate() for _ in prompts]
    for seq, p in zip(seqs, prompts, strict=True):
        prefill(tiny, cache, p, seq=seq)
    batched = decode_step(tiny, cache, seqs, next_ids)
    assert batched.shape == (3, tiny.config.vocab_size) and batched.dtype == torch.float32
    assert [s.length for s in seqs] == [11, 38, 2]
    torch.testing.assert_close(batched, torch.stack(alone), rtol=0, atol=1e-5)


def test_prefill_cache_full_leaves_the_sequence_unchanged(tiny):
    cache = PagedKVCache.for_model(tiny, num_blocks=2, block_size=4)
    seq = cache.allocate()
    prefill_chunk(tiny, cache, seq, prompt(7, 6))
    with pytest.raises(CacheFull, match="need 1 more block"):
        prefill_chunk(tiny, cache, seq, prompt(8, 3))
    assert seq == Seq(blocks=[0, 1], length=6)


def test_positions_past_max_seq_len_are_rejected():
    model = Transformer.from_config(ModelConfig.preset("tiny", max_seq_len=8))
    cache = PagedKVCache.for_model(model, num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="max_seq_len 8"):
        prefill(model, cache, prompt(9, 9))


# -- presets and weights -------------------------------------------------------------------


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_small_preset_has_about_25m_parameters():
    config = ModelConfig.preset("small")
    assert (config.n_layer, config.d_model, config.n_head, config.n_kv_head) == (8, 512, 8, 2)
    # 8 x (655,360 attention + 2,359,296 MLP + 1,024 norms) + 2 x 1,048,576 embedding and
    # head (vocabulary 2,048) + 512 final norm.
    n = n_params(Transformer.from_config(config))
    assert n == 26_223_104
    assert 24_000_000 <= n <= 27_000_000


def test_tiny_and_base_presets():
    tiny = ModelConfig.preset("tiny")
    assert (tiny.n_layer, tiny.d_model) == (2, 64)
    with torch.device("meta"):
        base = Transformer(ModelConfig.preset("base"))
    assert 0.9e9 <= n_params(base) <= 1.1e9
    assert ModelConfig.preset("tiny", n_layer=3).n_layer == 3
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        ModelConfig.preset("huge")


def test_weights_are_deterministic_for_a_seed(tiny):
    config = ModelConfig.preset("tiny")
    same = Transformer.from_config(config, seed=0).state_dict()
    other = Transformer.from_config(config, seed=1).state_dict()
    for name, value in tiny.state_dict().items():
        assert torch.equal(value, same[name]), name
    assert not torch.equal(tiny.output.weight, other["output.weight"])
    assert tiny.dtype == torch.float32 and tiny.device == torch.device("cpu")
    assert not any(p.requires_grad for p in tiny.parameters())


def test_safetensors_round_trip(tiny, tmp_path):
    st = pytest.importorskip("safetensors.torch")
    path = tmp_path / "tiny.safetensors"
    st.save_file(tiny.state_dict(), str(path))
    loaded = Transformer.from_safetensors(tiny.config, path)
    cache = PagedKVCache.for_model(tiny, num_blocks=4, block_size=16)
    tokens = prompt(10, 20)
    assert torch.equal(prefill(loaded, cache, tokens), prefill(tiny, cache, tokens))


def test_from_safetensors_loads_by_parameter_name(tiny, monkeypatch):
    # Stands in for the optional package so the loader is tested without it installed.
    fake = types.ModuleType("safetensors.torch")
    fake.load_file = lambda path, device: {k: v.clone() for k, v in tiny.state_dict().items()}
    monkeypatch.setitem(sys.modules, "safetensors", types.ModuleType("safetensors"))
    monkeypatch.setitem(sys.modules, "safetensors.torch", fake)
    loaded = Transformer.from_safetensors(tiny.config, "unused.safetensors")
    for name, value in tiny.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    torch.testing.assert_close(loaded.rope_cos, tiny.rope_cos, rtol=0, atol=0)


def test_from_safetensors_without_the_package_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ImportError, match="optional 'safetensors' package"):
        Transformer.from_safetensors(ModelConfig.preset("tiny"), "x.safetensors")
