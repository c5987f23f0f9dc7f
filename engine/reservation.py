"""The K/V cache side of admission: what a request costs the cache, in the terms of
``ttft.engine.policy``, and carrying an admission out.

A request is owed every block it can still grow into (prompt plus ``max_tokens``), so no
step ever finds the cache full; with ``preempt`` (recompute preemption,
``ttft.engine.policy``) only the blocks its prefill still needs, and a decoding request
the block its next token needs, if any. What a request prefills is its
``RequestState.context_ids``: the prompt, or after a preemption the prompt and the tokens
it generated. A waiting request's prefix-cache hit is looked up without being taken
(``waiting``); on admission it is taken (``take_prefix``) before anything is evicted, then
``reserve`` evicts unused prefix blocks until the owed blocks are free. Used only by the
engine's worker thread, like the caches it wraps.
"""

from __future__ import annotations

from collections.abc import Sequence

from ttft.engine.kv_cache import Seq
from ttft.engine.policy import Running, Waiting
from ttft.engine.prefix_cache import PrefixCache
from ttft.engine.stream import RequestState

__all__ = ["Reservations"]


class Reservations:
    """K/V accounting over one ``PrefixCache`` (and the ``PagedKVCache`` it wraps)."""

    def __init__(self, prefix_cache: PrefixCache, preempt: bool = False) -> None:
        self.prefix_cache = prefix_cache
        self.allocator = prefix_cache.cache.allocator
        self.block_size = prefix_cache.block_size
        self.preempt = preempt

    def blocks_for(self, positions: int) -> int:
        """Blocks that hold ``positions`` K/V positions."""
        return -(-positions // self.block_size)

    def owed(self, req: RequestState) -> int:
        """Blocks ``req`` can still grow into: its prompt plus ``max_tokens``; with
        preemption, its context while it prefills, one position more once it decodes."""
        held = len(req.seq.blocks) if req.seq is not None else 0
        if not self.preempt:
            return self.blocks_for(len(req.prompt_ids) + req.max_tokens) - held
        upto = len(req.context_ids)
        if req.seq is not None and req.computed >= upto:
            upto = req.seq.length + 1  # decoding: the position its next token writes
        return max(0, self.blocks_for(upto) - held)

    def free_blocks(self) -> int:
        """Blocks free now or held only by the prefix cache (walks the prefix cache)."""
        return self.allocator.num_free + self.prefix_cache.num_reclaimable()

    def running(self, req: RequestState) -> Running[RequestState]:
        left = len(req.context_ids) - req.computed
        if not self.preempt:
            return Running(req, left, self.owed(req))
        held = self.prefix_cache.cache.sole_blocks(req.seq) if req.seq is not None else 0
        if left:
            return Running(req, left, self.owed(req), 0, held)
        return Running(req, 0, 0, self.owed(req), held)

    def waiting(self, req: RequestState, eligible: bool) -> Waiting[RequestState]:
        """``req`` as the policy sees it; an eligible one with its prefix-cache hit looked
        up (not taken, not counted)."""
        if not eligible:
            return Waiting(req, False, 0, 0)
        hit = self.prefix_cache.peek(req.context_ids)
        left = len(req.context_ids) - len(hit) * self.block_size
        need = self.owed(req) - len(hit)
        return Waiting(req, True, left, need, self.prefix_cache.reclaimable(hit))

    def take_prefix(self, req: RequestState) -> int:
        """Give an admitted ``req`` its sequence, starting with its prefix-cache hit; a
        resumed request keeps the ``cached_tokens`` of its first admission (what its
        client is told). Returns the positions the hit covers."""
        blocks, cached = self.prefix_cache.match(req.context_ids)
        seq = Seq()
        self.prefix_cache.attach(seq, blocks, cached)
        req.seq, req.computed = seq, cached
        if req.recompute_ids is None:
            req.cached_tokens = cached
        return cached

    def release(self, req: RequestState) -> int:
        """Free a preempted ``req``'s blocks; what it prefills when admitted again is its
        prompt and the tokens it generated (``context_ids``). Returns the blocks given back
        (free now, or held only by the prefix cache)."""
        assert req.seq is not None  # a running request holds its sequence
        freed = self.prefix_cache.cache.sole_blocks(req.seq)
        self.prefix_cache.cache.free(req.seq)
        req.seq, req.computed = None, 0
        req.recompute_ids = req.prompt_ids + req.out_ids
        return freed

    def reserve(self, running: Sequence[RequestState]) -> None:
        """Make every block the ``running`` requests are owed free, evicting unused prefix
        blocks.

        Raises:
            RuntimeError: they do not fit, which a plan from ``plan_step`` over
                ``free_blocks`` and these requests never asks for.
        """
        owed = sum(self.owed(r) for r in running)
        if not self.prefix_cache.ensure_free(owed):
            raise RuntimeError(f"cannot reserve {owed} K/V blocks the plan counted on")
