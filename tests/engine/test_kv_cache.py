"""Paged K/V cache: write/gather round trips across block boundaries, the free list and
reference counts (requests vs. retain/release), and CacheFull."""

from __future__ import annotations

import pytest
import torch

from ttft.engine.kv_cache import BlockAllocator, CacheFull, PagedKVCache, Seq

H_KV, D = 2, 3


def make_cache(num_blocks: int = 8, block_size: int = 4) -> PagedKVCache:
    return PagedKVCache(
        n_layer=2, n_kv_head=H_KV, head_dim=D, num_blocks=num_blocks, block_size=block_size
    )


def kv(n: int, offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.arange(n * H_KV * D, dtype=torch.float32).view(n, H_KV, D) + offset
    return k, -k


def test_write_gather_round_trip_across_block_boundaries():
    cache = make_cache(num_blocks=8, block_size=4)
    a, b = cache.allocate(), cache.allocate()
    k, v = kv(10)
    # Chunks of 3, 5, 2 straddle block edges; b grows in between so a's blocks interleave.
    for start, n in [(0, 3), (3, 5), (8, 2)]:
        cache.append(a, n)
        cache.append(b, 4)
        b.length += 4
        cache.write(1, a.blocks, start, k[start : start + n], v[start : start + n])
        a.length += n
    assert a.blocks == [0, 2, 4]
    assert b.blocks == [1, 3, 5]
    k_out, v_out = cache.gather(1, a.blocks, 10)
    assert k_out.shape == (1, H_KV, 10, D)
    assert torch.equal(k_out, k.transpose(0, 1).unsqueeze(0))
    assert torch.equal(v_out, v.transpose(0, 1).unsqueeze(0))
    # Layer 0 was never written; a prefix gather is the prefix.
    assert torch.equal(cache.gather(0, a.blocks, 10)[0], torch.zeros(1, H_KV, 10, D))
    assert torch.equal(cache.gather(1, a.blocks, 6)[0], k[:6].transpose(0, 1).unsqueeze(0))


def test_write_past_the_block_table_is_an_error():
    cache = make_cache(block_size=4)
    seq = cache.allocate(4)
    k, v = kv(2)
    with pytest.raises(ValueError, match="call append"):
        cache.write(0, seq.blocks, 3, k, v)


def test_allocate_append_free():
    cache = make_cache(num_blocks=8, block_size=4)
    assert cache.blocks_in_use() == 0
    seq = cache.allocate(5)
    assert seq == Seq(blocks=[0, 1], length=0)
    seq.length = 5
    cache.append(seq, 3)  # 8 positions still fit two blocks
    assert seq.blocks == [0, 1]
    cache.append(seq, 4)
    assert seq.blocks == [0, 1, 2]
    assert cache.blocks_in_use() == 3
    cache.free(seq)
    assert seq == Seq()
    assert cache.blocks_in_use() == 0
    assert cache.allocator.num_free == 8
    cache.free(seq)  # freeing an empty sequence again is harmless


def test_retain_release_keeps_blocks_cached_and_unavailable():
    cache = make_cache(num_blocks=4, block_size=4)
    a = cache.allocate(8)
    assert a.blocks == [0, 1]
    cache.retain(0)
    assert (cache.blocks_in_use(), cache.blocks_cached()) == (2, 0)
    cache.free(a)
    assert (cache.blocks_in_use(), cache.blocks_cached()) == (0, 1)
    # Only the three unreferenced blocks can be handed out; block 0 is never reused.
    b = cache.allocate(12)
    assert sorted(b.blocks) == [1, 2, 3]
    with pytest.raises(CacheFull):
        cache.allocate(1)
    assert (cache.blocks_in_use(), cache.blocks_cached()) == (3, 1)
    cache.release(0)
    assert (cache.blocks_in_use(), cache.blocks_cached()) == (3, 0)
    assert cache.allocate(1).blocks == [0]
    with pytest.raises(ValueError, match="not retained"):
        cache.release(0)


def test_retained_block_shared_with_a_live_request_counts_as_in_use():
    cache = make_cache(num_blocks=4)
    a = cache.allocate(1)
    cache.retain(a.blocks[0])
    cache.retain(a.blocks[0])
    assert (cache.blocks_in_use(), cache.blocks_cached()) == (1, 0)
    cache.free(a)
    assert (cache.blocks_in_use(), cache.blocks_cached()) == (0, 1)
    cache.release(0)
    cache.release(0)
    assert (cache.blocks_in_use(), cache.blocks_cached(), cache.allocator.num_free) == (0, 0, 4)
    with pytest.raises(ValueError, match="only a referenced block"):
        cache.retain(0)


def test_cache_full_is_all_or_nothing_with_a_clear_message():
    cache = make_cache(num_blocks=3, block_size=4)
    a = cache.allocate(8)
    with pytest.raises(
        CacheFull,
        match=r"need 3 more block\(s\) of 4 tokens for 9 positions, 1 of 3 free "
        r"\(2 in use by requests, 0 held only by the prefix cache\)",
    ):
        cache.allocate(9)
    assert cache.allocator.num_free == 1
    a.length = 8
    with pytest.raises(CacheFull, match="need 3 more"):
        cache.append(a, 9)
    assert (a.blocks, cache.allocator.num_free) == ([0, 1], 1)


def test_block_allocator_free_list_and_refcounts():
    alloc = BlockAllocator(2)
    assert [alloc.allocate(), alloc.allocate()] == [0, 1]
    with pytest.raises(CacheFull, match="all 2 blocks are referenced"):
        alloc.allocate()
    alloc.incref(1)
    alloc.decref(1)
    assert alloc.num_free == 0
    alloc.decref(1)
    assert alloc.num_free == 1
    with pytest.raises(ValueError, match="double free"):
        alloc.decref(1)
    assert alloc.allocate() == 1


def test_gather_is_a_copy_and_consecutive_blocks_are_read_in_place():
    cache = make_cache(num_blocks=8, block_size=4)
    seq = cache.allocate(10)
    assert seq.blocks == [0, 1, 2]
    k, v = kv(10)
    cache.write(0, seq.blocks, 0, k, v)
    k_out, v_out = cache.gather(0, seq.blocks, 10)
    view_k, view_v = cache._prefix(0, seq.blocks, 10)
    assert torch.equal(view_k, k_out) and torch.equal(view_v, v_out)
    assert view_k.data_ptr() == cache.k[0].data_ptr()  # no copy
    k_out.zero_()  # a copy: the cache is untouched
    assert torch.equal(cache.gather(0, seq.blocks, 10)[0], k.transpose(0, 1).unsqueeze(0))
    # Freed blocks come back in the same ascending order.
    cache.free(seq)
    assert cache.allocate(10).blocks == [0, 1, 2]
