"""The K/V cache side of admission: what a request costs the cache, in the terms of
``ttft.engine.policy``, and carrying an admission out.

A request is owed every block it can still grow into (prompt plus ``max_tokens``), so no
step ever finds the cache full. A waiting request's prefix-cache hit is looked up without
being taken (``describe``); on admission it is taken (``take_prefix``) before anything is
evicted, then ``reserve`` evicts unused prefix blocks until the owed blocks are free.
Used only by the engine's worker thread, like the caches it wraps.
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

    def __init__(self, prefix_cache: PrefixCache) -> None:
        self.prefix_cache = prefix_cache
        self.allocator = prefix_cache.cache.allocator
        self.block_size = prefix_cache.block_size

    def blocks_for(self, positions: int) -> int:
        """Blocks that hold ``positions`` K/V positions."""
        return -(-positions // self.block_size)

    def owed(self, req: RequestState) -> int:
        """Blocks ``req`` can still grow into (its prompt plus ``max_tokens``)."""
        held = len(req.seq.blocks) if req.seq is not None else 0
        return self.blocks_for(len(req.prompt_ids) + req.max_tokens) - held

    def free_blocks(self) -> int:
        """Blocks free now or held only by the prefix cache (walks the prefix cache)."""
        return self.allocator.num_free + self.prefix_cache.num_reclaimable()

    def running(self, req: RequestState) -> Running[RequestState]:
        return Running(req, len(req.prompt_ids) - req.computed, self.owed(req))

    def waiting(self, req: RequestState, eligible: bool) -> Waiting[RequestState]:
        """``req`` as the policy sees it; an eligible one with its prefix-cache hit looked
        up (not taken, not counted)."""
        if not eligible:
            return Waiting(req, False, 0, 0)
        hit = self.prefix_cache.peek(req.prompt_ids)
        left = len(req.prompt_ids) - len(hit) * self.block_size
        need = self.owed(req) - len(hit)
        return Waiting(req, True, left, need, self.prefix_cache.reclaimable(hit))

    def take_prefix(self, req: RequestState) -> None:
        """Give an admitted ``req`` its sequence, starting with its prefix-cache hit."""
        blocks, cached = self.prefix_cache.match(req.prompt_ids)
        seq = Seq()
        self.prefix_cache.attach(seq, blocks, cached)
        req.seq, req.cached_tokens, req.computed = seq, cached, cached

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
