"""Exact-prefix reuse of full K/V blocks, keyed by a hash chain, with LRU eviction.

As in vLLM and SGLang, block ``i`` of a prompt is named by
``hash((key of block i-1, tuple(tokens of block i)))``, so one key stands for the whole
prefix up to the end of that block. Only full blocks are cached. The prefix cache holds one
reference of its own on each cached block (``PagedKVCache.retain``), so a block outlives
the request that computed it until it is evicted; a block a live request still references
is never evicted.

Typical use by an engine (one thread, like the ``PagedKVCache`` it wraps)::

    blocks, cached_tokens = pc.match(prompt)
    seq = Seq()
    pc.attach(seq, blocks, cached_tokens)       # before any ensure_free/evict
    pc.ensure_free(blocks_needed_for_the_rest)
    logits = prefill_chunk(model, cache, seq, prompt[cached_tokens:])
    pc.insert(prompt, seq)
    ...
    cache.free(seq)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from ttft.engine.kv_cache import PagedKVCache, Seq

_ROOT: int | None = None  # the parent key of block 0


@dataclass
class _Entry:
    block: int
    parent: int | None  # key of the previous block; _ROOT for block 0
    tokens: tuple[int, ...]  # kept to tell a real match from a hash collision
    children: set[int] = field(default_factory=set)


class PrefixCache:
    """Full blocks of earlier prompts, found again by exact token prefix.

    Not thread-safe: call it from the thread that owns the ``PagedKVCache``.

    Attributes:
        hits: ``match`` calls that found at least one block.
        misses: ``match`` calls that found none.
        cached_tokens_served: prompt tokens covered by matched blocks, over all calls.
        evicted_blocks: blocks whose cache reference was dropped by eviction.
    """

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache
        self.block_size = cache.block_size
        # key -> entry, least recently used first.
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._key_of_block: dict[int, int] = {}
        self.hits = 0
        self.misses = 0
        self.cached_tokens_served = 0
        self.evicted_blocks = 0

    def __len__(self) -> int:
        """Blocks the prefix cache holds a reference on (live requests may share them)."""
        return len(self._entries)

    @staticmethod
    def block_key(parent: int | None, tokens: tuple[int, ...]) -> int:
        """The chain key of a block holding ``tokens`` after the prefix named ``parent``."""
        return hash((parent, tokens))

    def _chain(
        self, token_ids: list[int], n_blocks: int
    ) -> Iterator[tuple[int, int | None, tuple[int, ...]]]:
        """(key, parent key, tokens) of the first ``n_blocks`` full blocks."""
        parent, bs = _ROOT, self.block_size
        for i in range(n_blocks):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            key = self.block_key(parent, tokens)
            yield key, parent, tokens
            parent = key

    def _touch(self, keys: list[int]) -> None:
        # Most recent last, children before their parents: LRU order then evicts the tail
        # of a chain before its head, so a shorter prefix stays usable.
        for key in reversed(keys):
            self._entries.move_to_end(key)

    # -- lookup -------------------------------------------------------------------------

    def _longest(self, token_ids: list[int]) -> tuple[list[int], list[int]]:
        """(blocks, keys) of the longest cached chain prefixing ``token_ids``, leaving at
        least one token to compute."""
        max_blocks = max(len(token_ids) - 1, 0) // self.block_size
        blocks: list[int] = []
        keys: list[int] = []
        for key, parent, tokens in self._chain(token_ids, max_blocks):
            entry = self._entries.get(key)
            if entry is None or entry.parent != parent or entry.tokens != tokens:
                break
            blocks.append(entry.block)
            keys.append(key)
        return blocks, keys

    def peek(self, token_ids: list[int]) -> list[int]:
        """The blocks ``match`` would return now, without counting a hit or a miss and
        without refreshing their LRU order (a scheduler's look before it decides)."""
        return self._longest(token_ids)[0]

    def match(self, token_ids: list[int]) -> tuple[list[int], int]:
        """The longest cached chain of full blocks that prefixes ``token_ids``.

        At least one token is always left to compute, so the last position's logits come
        from a real forward pass: at most ``(len(token_ids) - 1) // block_size`` blocks.

        Returns:
            ``(blocks, cached_tokens)`` with ``cached_tokens == len(blocks) * block_size``.
            The blocks are only lent: ``attach`` them to a request before anything can
            evict (``evict``/``ensure_free``).
        """
        blocks, keys = self._longest(token_ids)
        self._touch(keys)
        cached_tokens = len(blocks) * self.block_size
        if blocks:
            self.hits += 1
            self.cached_tokens_served += cached_tokens
        else:
            self.misses += 1
        return blocks, cached_tokens

    def attach(self, seq: Seq, blocks: list[int], cached_tokens: int) -> None:
        """Make matched ``blocks`` the start of a new request's ``seq``, each with a
        reference of the request's own (dropped by ``PagedKVCache.free(seq)``), and set
        ``seq.length = cached_tokens``; the caller prefills only the tokens after that.

        Raises:
            ValueError: ``seq`` already has blocks or positions, ``cached_tokens`` is not
                ``len(blocks) * block_size``, or a block is no longer in the prefix cache
                (evicted since ``match``). Nothing is changed then.
        """
        if seq.blocks or seq.length:
            raise ValueError(
                f"attach needs an empty Seq, got {len(seq.blocks)} block(s) and length {seq.length}"
            )
        if cached_tokens != len(blocks) * self.block_size:
            raise ValueError(
                f"cached_tokens {cached_tokens} != {len(blocks)} block(s) x block_size "
                f"{self.block_size}"
            )
        stale = [b for b in blocks if b not in self._key_of_block]
        if stale:
            raise ValueError(f"block(s) {stale} are not in the prefix cache (evicted since match?)")
        for block in blocks:
            self.cache.allocator.incref(block)
        seq.blocks = list(blocks)
        seq.length = cached_tokens

    # -- registration -------------------------------------------------------------------

    def insert(self, token_ids: list[int], seq: Seq) -> int:
        """Register ``seq``'s full, written blocks under the chain keys of ``token_ids``
        (the tokens whose K/V ``seq`` holds, from position 0), taking a prefix-cache
        reference on each newly cached block.

        A prefix already cached under another block keeps that block (the request's copy
        is freed with the request).

        Returns:
            The number of blocks newly cached.
        """
        n_blocks = min(len(token_ids), seq.length, len(seq.blocks) * self.block_size)
        n_blocks //= self.block_size
        keys: list[int] = []
        added = 0
        for i, (key, parent, tokens) in enumerate(self._chain(token_ids, n_blocks)):
            entry = self._entries.get(key)
            if entry is not None:
                if entry.parent != parent or entry.tokens != tokens:
                    break  # hash collision: leave the rest of this chain uncached
                keys.append(key)
                continue
            block = seq.blocks[i]
            if block in self._key_of_block:
                break  # already cached under another prefix; never hold two references
            self.cache.retain(block)
            self._entries[key] = _Entry(block, parent, tokens)
            self._key_of_block[block] = key
            if parent is not _ROOT:
                self._entries[parent].children.add(key)
            keys.append(key)
            added += 1
        self._touch(keys)
        return added

    # -- eviction -----------------------------------------------------------------------

    def _evictable(self, entry: _Entry) -> bool:
        # The prefix cache holds exactly one reference per cached block; more means a live
        # request (or another holder) still uses it.
        return self.cache.allocator.ref_counts[entry.block] == 1

    def _drop(self, key: int) -> int:
        """Forget ``key`` and every key chained after it; blocks freed by that."""
        freed, stack = 0, [key]
        entry = self._entries[key]
        if entry.parent is not _ROOT and entry.parent in self._entries:
            self._entries[entry.parent].children.discard(key)
        while stack:
            entry = self._entries.pop(stack.pop())
            stack.extend(entry.children)
            del self._key_of_block[entry.block]
            freed += self.cache.allocator.ref_counts[entry.block] == 1
            # A dependent block a live request still uses only loses the cache's
            # reference: unreachable by match once its parent is gone.
            self.cache.release(entry.block)
            self.evicted_blocks += 1
        return freed

    def num_reclaimable(self) -> int:
        """Blocks held only by the prefix cache: what evicting everything would free."""
        return sum(1 for e in self._entries.values() if self._evictable(e))

    def reclaimable(self, blocks: list[int]) -> frozenset[int]:
        """The ``blocks`` (cached ones, as ``peek`` returns) held only by the prefix cache:
        attaching them to a request takes them out of ``num_reclaimable``."""
        refs = self.cache.allocator.ref_counts
        return frozenset(b for b in blocks if b in self._key_of_block and refs[b] == 1)

    def evict(self, n_blocks: int) -> int:
        """Free up to ``n_blocks`` blocks held only by the prefix cache, least recently
        used first; blocks chained after an evicted one are dropped from the cache too.
        Blocks a live request references are never freed.

        Returns:
            The number of blocks returned to the free list (can exceed ``n_blocks`` when
            dependents go with their parent).
        """
        freed = 0
        while freed < n_blocks:
            victim = next((k for k, e in self._entries.items() if self._evictable(e)), None)
            if victim is None:
                break
            freed += self._drop(victim)
        return freed

    def ensure_free(self, n_blocks: int) -> bool:
        """Evict until at least ``n_blocks`` blocks are free, if that is possible.

        Returns:
            Whether ``n_blocks`` blocks are free now.
        """
        short = n_blocks - self.cache.allocator.num_free
        if short > 0:
            self.evict(short)
        return self.cache.allocator.num_free >= n_blocks

    def clear(self) -> int:
        """Drop every cached block not in use; returns how many were freed."""
        return self.evict(self.cache.num_blocks)
