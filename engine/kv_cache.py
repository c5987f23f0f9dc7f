"""Paged K/V cache: per-layer storage in fixed-size blocks, a free list, reference counts.

As in vLLM, a request's K/V lives in blocks named by its block table: position ``p`` is
slot ``p % block_size`` of block ``blocks[p // block_size]``. Blocks are reference counted
so a prefix cache can keep a finished request's blocks alive (``retain``/``release``)
while new requests allocate around them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


class CacheFull(RuntimeError):
    """No free block is left for an allocation."""


@dataclass
class Seq:
    """One request's view of the cache: its block table and how many positions are written.

    Attributes:
        blocks: block ids; position ``p`` lives in ``blocks[p // block_size]``.
        length: positions ``0 .. length-1`` hold valid K/V (the cached prefix).
    """

    blocks: list[int] = field(default_factory=list)
    length: int = 0


class BlockAllocator:
    """A free list of block ids with reference counts; a block is free at zero references."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        # Popped from the end: the lowest ids are handed out first.
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        """Take a free block with one reference.

        Raises:
            CacheFull: when no block is free.
        """
        if not self._free:
            raise CacheFull(f"KV cache full: all {self.num_blocks} blocks are referenced")
        block = self._free.pop()
        self.ref_counts[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self.ref_counts[block] < 1:
            raise ValueError(f"block {block} is free; only a referenced block can be shared")
        self.ref_counts[block] += 1

    def decref(self, block: int) -> None:
        if self.ref_counts[block] < 1:
            raise ValueError(f"block {block} is already free (double free)")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._free.append(block)


class PagedKVCache:
    """K and V for every layer, one preallocated ``(num_blocks, block_size, H_kv, D)``
    tensor each, plus the allocator that hands out their blocks.

    Not thread-safe: one engine thread owns it.
    """

    def __init__(
        self,
        n_layer: int,
        n_kv_head: int,
        head_dim: int,
        num_blocks: int,
        block_size: int = 16,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.device = torch.device(device)
        shape = (num_blocks, block_size, n_kv_head, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.allocator = BlockAllocator(num_blocks)
        self._retained = [0] * num_blocks  # references held by retain(), not by requests

    @classmethod
    def for_model(cls, model: Any, num_blocks: int, block_size: int = 16) -> PagedKVCache:
        """A cache shaped for ``model`` (a ``Transformer``), on its device and in its dtype."""
        c = model.config
        param = next(model.parameters())
        return cls(
            c.n_layer, c.n_kv_head, c.head_dim, num_blocks, block_size, param.device, param.dtype
        )

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    # -- growth and release -------------------------------------------------------------

    def allocate(self, n_tokens: int = 0) -> Seq:
        """A new request with room for ``n_tokens`` positions and nothing written yet."""
        seq = Seq()
        self.append(seq, n_tokens)
        return seq

    def append(self, seq: Seq, n_tokens: int) -> None:
        """Grow ``seq``'s block table so that ``seq.length + n_tokens`` positions fit.

        All or nothing: on ``CacheFull`` no block was taken.
        """
        need = -(-(seq.length + n_tokens) // self.block_size) - len(seq.blocks)
        if need <= 0:
            return
        if need > self.allocator.num_free:
            raise CacheFull(
                f"KV cache full: need {need} more block(s) of {self.block_size} tokens for "
                f"{seq.length + n_tokens} positions, {self.allocator.num_free} of "
                f"{self.num_blocks} free ({self.blocks_in_use()} in use by requests, "
                f"{self.blocks_cached()} held only by the prefix cache)"
            )
        seq.blocks.extend(self.allocator.allocate() for _ in range(need))

    def free(self, seq: Seq) -> None:
        """Drop ``seq``'s references at once; blocks nobody else holds become free."""
        # Last block first: the free list is a stack, so the next request is handed these
        # ids in ascending order again, and consecutive ids let ``_prefix`` skip the copy.
        for block in reversed(seq.blocks):
            self.allocator.decref(block)
        seq.blocks = []
        seq.length = 0

    def retain(self, block: int) -> None:
        """Hold an extra reference on a referenced block (for a prefix cache)."""
        self.allocator.incref(block)
        self._retained[block] += 1

    def release(self, block: int) -> None:
        """Drop a reference taken by ``retain``."""
        if self._retained[block] < 1:
            raise ValueError(f"block {block} was not retained")
        self._retained[block] -= 1
        self.allocator.decref(block)

    def blocks_in_use(self) -> int:
        """Blocks referenced by at least one live request."""
        refs, kept = self.allocator.ref_counts, self._retained
        return sum(1 for b in range(self.num_blocks) if refs[b] > kept[b])

    def sole_blocks(self, seq: Seq) -> int:
        """Blocks of ``seq`` no other request references: freeing ``seq`` makes them free,
        or leaves them held only by ``retain`` (reclaimable)."""
        refs, kept = self.allocator.ref_counts, self._retained
        return sum(1 for b in seq.blocks if refs[b] - kept[b] == 1)

    def blocks_cached(self) -> int:
        """Blocks referenced only through ``retain`` (no live request holds them)."""
        refs, kept = self.allocator.ref_counts, self._retained
        return sum(1 for b in range(self.num_blocks) if kept[b] > 0 and refs[b] == kept[b])

    # -- data ---------------------------------------------------------------------------

    def _check_fits(self, blocks: list[int], start_pos: int, n: int) -> None:
        if start_pos < 0 or start_pos + n > len(blocks) * self.block_size:
            raise ValueError(
                f"positions {start_pos}..{start_pos + n - 1} do not fit a block table of "
                f"{len(blocks)} block(s) of {self.block_size}; call append() first"
            )

    def _run_start(self, blocks: list[int], start_pos: int, n: int) -> int | None:
        """Flat slot of ``start_pos`` when positions ``start_pos .. start_pos+n-1`` lie in
        consecutive block ids (then they are consecutive rows of the flattened storage),
        else None."""
        span = blocks[start_pos // self.block_size : (start_pos + n - 1) // self.block_size + 1]
        if span != list(range(span[0], span[0] + len(span))):
            return None
        return span[0] * self.block_size + start_pos % self.block_size

    def _flat_slots(self, blocks: list[int], start_pos: int, n: int) -> torch.Tensor:
        """Rows of the flattened ``(num_blocks * block_size, H_kv, D)`` storage holding
        positions ``start_pos .. start_pos+n-1``."""
        pos = torch.arange(start_pos, start_pos + n, device=self.device)
        table = torch.tensor(blocks, dtype=torch.long, device=self.device)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def write(
        self, layer: int, block_table: list[int], start_pos: int, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store one request's K/V for positions ``start_pos .. start_pos + T - 1``.

        Args:
            layer: layer index.
            block_table: the request's block ids (``Seq.blocks``).
            start_pos: position of the first row of ``k``/``v``.
            k, v: ``(T, H_kv, D)``.
        """
        n = k.size(0)
        self._check_fits(block_table, start_pos, n)
        if n == 0:
            return
        k_flat, v_flat = self.k[layer].flatten(0, 1), self.v[layer].flatten(0, 1)
        run = self._run_start(block_table, start_pos, n)
        if run is not None:  # consecutive blocks: one slice copy, no index tensors
            k_flat[run : run + n] = k
            v_flat[run : run + n] = v
            return
        rows = self._flat_slots(block_table, start_pos, n)
        k_flat[rows] = k
        v_flat[rows] = v

    def gather(
        self, layer: int, block_table: list[int], length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions ``0 .. length-1`` of one request, shaped for ``attend``.

        Returns:
            k, v: ``(1, H_kv, length, D)`` copies (not views of the cache).
        """
        k, v = self._prefix(layer, block_table, length)
        return k.clone(), v.clone()

    def _prefix(
        self, layer: int, block_table: list[int], length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Like ``gather``, but views of the cache when the blocks holding positions
        ``0 .. length-1`` are consecutive ids (no copy), else copies of whole blocks.

        The views alias the cache: read them before the next ``write`` of this layer.
        """
        self._check_fits(block_table, 0, length)
        n_blocks = -(-length // self.block_size)
        if length == 0 or self._run_start(block_table, 0, length) is not None:
            first = block_table[0] if block_table else 0
            k = self.k[layer][first : first + n_blocks]  # (n_blocks, block_size, H_kv, D)
            v = self.v[layer][first : first + n_blocks]
        else:
            table = torch.tensor(block_table[:n_blocks], dtype=torch.long, device=self.device)
            k = self.k[layer].index_select(0, table)
            v = self.v[layer].index_select(0, table)
        k, v = k.flatten(0, 1)[:length], v.flatten(0, 1)[:length]  # (L, H_kv, D)
        return k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
