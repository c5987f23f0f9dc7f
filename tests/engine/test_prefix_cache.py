"""The prefix cache on the real tiny model: a hit gives the same logits and continuation
while computing fewer positions, shared prefixes hit, LRU eviction never touches blocks a
live request uses, and bookkeeping (refcounts, counters, in-use vs cached) stays exact."""

from __future__ import annotations

import pytest
import torch

from ttft.engine.kv_cache import PagedKVCache, Seq
from ttft.engine.model import ModelConfig, Transformer, decode_step, greedy, prefill, prefill_chunk
from ttft.engine.prefix_cache import PrefixCache

BS = 8  # block size


@pytest.fixture(scope="module")
def tiny() -> Transformer:
    return Transformer.from_config(ModelConfig.preset("tiny"), seed=0)


def prompt(seed: int, n: int, vocab: int = 512) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def start(model, cache, pc: PrefixCache, tokens: list[int]) -> tuple[Seq, torch.Tensor, int]:
    """Admit a request through the prefix cache: (seq, last logits, positions computed)."""
    blocks, cached_tokens = pc.match(tokens)
    seq = Seq()
    pc.attach(seq, blocks, cached_tokens)
    rest = tokens[cached_tokens:]
    assert pc.ensure_free(-(-(seq.length + len(rest)) // BS) - len(seq.blocks))
    logits = prefill_chunk(model, cache, seq, rest)
    pc.insert(tokens, seq)
    return seq, logits, len(rest)


def run(
    model, cache, pc, tokens: list[int], max_tokens: int
) -> tuple[list[int], torch.Tensor, int]:
    """A whole greedy request through the prefix cache; frees its blocks at the end."""
    seq, logits, computed = start(model, cache, pc, tokens)
    first = logits
    out: list[int] = []
    try:
        while len(out) < max_tokens:
            out.append(int(logits.argmax()))
            if len(out) < max_tokens:
                logits = decode_step(model, cache, [seq], [out[-1]])[0]
    finally:
        cache.free(seq)
    return out, first, computed


def kv_of(cache: PagedKVCache, blocks: list[int]) -> list[torch.Tensor]:
    return [t[blocks].clone() for t in cache.k + cache.v]


def test_hit_gives_the_same_logits_and_continuation_with_fewer_positions(tiny):
    tokens = prompt(0, 43)
    ref_cache = PagedKVCache.for_model(tiny, 16, BS)
    ref_logits = prefill(tiny, ref_cache, tokens)
    ref_out = greedy(tiny, ref_cache, tokens, 6)

    cache = PagedKVCache.for_model(tiny, 16, BS)
    pc = PrefixCache(cache)
    cold_out, cold_logits, cold_computed = run(tiny, cache, pc, tokens, 6)
    warm_out, warm_logits, warm_computed = run(tiny, cache, pc, tokens, 6)

    assert (cold_computed, warm_computed) == (43, 43 - 40)
    assert (pc.hits, pc.misses, pc.cached_tokens_served) == (1, 1, 40)
    assert torch.allclose(cold_logits, ref_logits, atol=1e-5, rtol=0)
    assert torch.allclose(warm_logits, ref_logits, atol=1e-5, rtol=0)
    assert cold_out == warm_out == ref_out


def test_a_full_block_prompt_still_computes_its_last_block(tiny):
    cache = PagedKVCache.for_model(tiny, 16, BS)
    pc = PrefixCache(cache)
    tokens = prompt(1, 4 * BS)
    run(tiny, cache, pc, tokens, 1)
    assert pc.match(tokens)[1] == 3 * BS  # never the whole prompt
    _, logits, computed = run(tiny, cache, pc, tokens, 1)
    assert computed == BS
    assert torch.allclose(logits, prefill(tiny, cache, tokens), atol=1e-5, rtol=0)
    assert pc.match(tokens[:1]) == ([], 0)


def test_shared_prefix_hits_for_the_second_prompt(tiny):
    cache = PagedKVCache.for_model(tiny, 16, BS)
    pc = PrefixCache(cache)
    shared = prompt(2, 3 * BS)
    a, b = shared + prompt(3, 13), shared + prompt(4, 5)
    _, _, computed_a = run(tiny, cache, pc, a, 1)
    out_b, logits_b, computed_b = run(tiny, cache, pc, b, 4)
    assert (computed_a, computed_b) == (len(a), 5)
    assert (pc.hits, pc.misses) == (1, 1)
    assert torch.allclose(logits_b, prefill(tiny, cache, b), atol=1e-5, rtol=0)
    assert out_b == greedy(tiny, cache, b, 4)
    # A different first block shares nothing, even with the same later tokens.
    assert pc.match(prompt(5, BS) + b[BS:]) == ([], 0)


def test_blocks_stay_cached_after_requests_end_until_evicted(tiny):
    cache = PagedKVCache.for_model(tiny, 16, BS)
    pc = PrefixCache(cache)
    seq, _, _ = start(tiny, cache, pc, prompt(6, 3 * BS + 2))
    assert (cache.blocks_in_use(), cache.blocks_cached(), len(pc)) == (4, 0, 3)
    cache.free(seq)
    assert (cache.blocks_in_use(), cache.blocks_cached()) == (0, 3)
    assert cache.allocator.num_free == 16 - 3
    assert pc.evict(100) == 3
    assert (cache.blocks_in_use(), cache.blocks_cached(), len(pc)) == (0, 0, 0)
    assert cache.allocator.num_free == 16
    assert pc.evicted_blocks == 3


def test_eviction_under_pressure_never_touches_a_live_request(tiny):
    cache = PagedKVCache.for_model(tiny, 12, BS)
    pc = PrefixCache(cache)
    shared = prompt(7, 2 * BS)
    run(tiny, cache, pc, shared + prompt(8, BS + 1), 1)  # caches 3 blocks
    live_tokens = shared + prompt(9, BS + 3)
    live, _, computed = start(tiny, cache, pc, live_tokens)  # 2 hit + 2 new, 1 cached
    assert computed == BS + 3
    run(tiny, cache, pc, prompt(10, 3 * BS + 1), 1)  # 3 more cached blocks
    assert (cache.blocks_in_use(), cache.blocks_cached()) == (4, 4)
    refs = [cache.allocator.ref_counts[b] for b in live.blocks]
    assert refs == [2, 2, 2, 1]  # shared and own full block: request + prefix cache
    kv = kv_of(cache, live.blocks)

    # A new 6-block prompt needs 6 of 12 blocks with only 4 free: evict LRU cached ones.
    big = prompt(11, 6 * BS - 3)
    out, logits, _ = run(tiny, cache, pc, big, 2)
    assert pc.evicted_blocks >= 2

    assert [cache.allocator.ref_counts[b] for b in live.blocks] == refs
    assert all(torch.equal(x, y) for x, y in zip(kv, kv_of(cache, live.blocks), strict=True))
    # Evict everything evictable: the live request's blocks stay, and so do their entries.
    pc.evict(100)
    assert cache.blocks_cached() == 0
    assert [cache.allocator.ref_counts[b] for b in live.blocks] == refs
    assert all(torch.equal(x, y) for x, y in zip(kv, kv_of(cache, live.blocks), strict=True))
    assert pc.match(live_tokens + [1]) == (live.blocks[:3], 3 * BS)

    # The live request continues exactly as an uncached run would.
    logits = prefill_chunk(tiny, cache, live, [5])
    cache.free(live)
    ref = PagedKVCache.for_model(tiny, 12, BS)
    assert torch.allclose(logits, prefill(tiny, ref, live_tokens + [5]), atol=1e-5, rtol=0)
    assert cache.blocks_in_use() == 0


def test_lru_order_evicts_the_least_recently_matched_and_chain_tails_first(tiny):
    cache = PagedKVCache.for_model(tiny, 16, BS)
    pc = PrefixCache(cache)
    a, b = prompt(12, 2 * BS + 1), prompt(13, BS + 1)
    run(tiny, cache, pc, a, 1)
    run(tiny, cache, pc, b, 1)
    pc.match(a)  # a is now the most recent
    assert pc.evict(1) == 1
    assert pc.match(b) == ([], 0)
    assert pc.evict(1) == 1  # a's second block goes before its first
    assert pc.match(a)[1] == BS
    assert pc.ensure_free(16) and len(pc) == 0


def test_evicting_a_block_drops_the_chain_after_it(tiny):
    cache = PagedKVCache.for_model(tiny, 16, BS)
    pc = PrefixCache(cache)
    base = prompt(14, 2 * BS)
    # Two requests with the same start prefill concurrently, so both miss.
    first, second = Seq(), Seq()
    prefill_chunk(tiny, cache, first, base + [1])
    longer = base + prompt(15, BS + 1)
    prefill_chunk(tiny, cache, second, longer)
    assert pc.insert(base + [1], first) == 2
    assert pc.insert(longer, second) == 1  # its first two blocks are already cached
    cache.free(first)
    assert cache.blocks_cached() == 2
    own = second.blocks[2]
    assert cache.allocator.ref_counts[own] == 2

    # Evicting the shared blocks drops the third key too; its block stays with `second`.
    assert pc.evict(100) == 2
    assert len(pc) == 0
    assert cache.allocator.ref_counts[own] == 1
    assert pc.match(longer) == ([], 0)
    cache.free(second)
    assert cache.allocator.num_free == 16


def test_attach_refuses_misuse_and_changes_nothing(tiny):
    cache = PagedKVCache.for_model(tiny, 16, BS)
    pc = PrefixCache(cache)
    tokens = prompt(16, 2 * BS + 1)
    run(tiny, cache, pc, tokens, 1)
    blocks, cached_tokens = pc.match(tokens)
    busy = Seq(blocks=[], length=3)
    with pytest.raises(ValueError, match="empty Seq"):
        pc.attach(busy, blocks, cached_tokens)
    with pytest.raises(ValueError, match="cached_tokens"):
        pc.attach(Seq(), blocks, cached_tokens - 1)
    pc.evict(100)
    with pytest.raises(ValueError, match="evicted since match"):
        pc.attach(Seq(), blocks, cached_tokens)
    assert cache.allocator.num_free == 16
