"""The shared-memory K/V channel (``kv_channel="shm"``): both workers on one host.

The decode side creates a ring of ``size_bytes`` in shared memory (``ShmRing``) and names
it in the worker's spec; the prefill worker maps it (``RingWriter``), packs each chunk's
blocks straight from its cache into a free slot of the ring (one copy: cache to shared
memory) and puts only a small ``blocks`` message on the socket, ``shm: [offset, bytes]``
and no payload. The decode side copies the slot into its paged cache (``install_blocks``,
as for a socket payload; a request not admitted yet gets a private copy instead, as a
socket payload would) and frees the slot at once with a ``free`` message back.

Slots are taken and freed in order (the decode side handles blocks messages one by one,
in order), so the ring is a plain FIFO of byte ranges. Flow control: the worker waits for
space when the ring is full. A batch larger than the ring is split into messages of at
most ``RingWriter.max_blocks`` blocks (the ``first``/``count`` protocol already carries a
request's blocks in several messages), so every block goes through shared memory and a
ring of one block works, only slower; the socket payload path is not mixed in.

Lifetime: only the decode side unlinks the segment, on ``stop`` and as soon as the worker
is gone; the worker maps it without registering it with ``multiprocessing``'s resource
tracker, which would otherwise unlink it when the worker exits.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import torch

from ttft.engine.disagg.channel import (
    Outbox,
    SocketBlocks,
    block_bytes,
    install_blocks,
    pack_blocks,
)
from ttft.engine.kv_cache import PagedKVCache

__all__ = [
    "DEFAULT_RING_BYTES",
    "KV_CHANNELS",
    "RingWriter",
    "ShmBlocks",
    "ShmRing",
    "blocks_source",
    "check_channel",
]

DEFAULT_RING_BYTES = 64 << 20
"""The ring's size unless told: a few 256-token chunks of a small model's blocks."""


class ShmRing:
    """The decode side's ring: created here, unlinked by ``close``.

    Args:
        size_bytes: the ring's size (at least one block of the cache it serves).
    """

    def __init__(self, size_bytes: int = DEFAULT_RING_BYTES) -> None:
        if size_bytes <= 0:
            raise ValueError(f"a shared-memory ring of {size_bytes} bytes")
        self._shm: shared_memory.SharedMemory | None = shared_memory.SharedMemory(
            create=True, size=size_bytes)
        self.name = self._shm.name
        self.size_bytes = size_bytes

    def spec(self) -> dict[str, Any]:
        """What the worker's spec carries to map the ring (``RingWriter.from_spec``)."""
        return {"name": self.name, "bytes": self.size_bytes}

    def view(self, offset: int, nbytes: int) -> memoryview:
        """The slot at ``offset`` (release the view before ``close``).

        Raises:
            ValueError: the slot is not inside the ring, or the ring is closed.
        """
        if self._shm is None or not (0 <= offset and 0 < nbytes and offset + nbytes
                                     <= self.size_bytes):
            raise ValueError(f"no slot of {nbytes} bytes at {offset} in the ring")
        return self._shm.buf[offset : offset + nbytes]

    def close(self) -> None:
        """Unmap and unlink the segment (no name is left in ``/dev/shm``). Idempotent."""
        shm, self._shm = self._shm, None
        if shm is None:
            return
        with contextlib.suppress(BufferError):  # a view still held: unlinked all the same
            shm.close()
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()


class ShmBlocks:
    """One ``blocks`` message's slot, read by the decode side's receiver: ``install``
    (into the cache) or ``payload`` (a private copy), then ``release`` frees the slot."""

    def __init__(self, ring: ShmRing, header: dict[str, Any], free: Any) -> None:
        self.offset, self.nbytes = (int(x) for x in header["shm"])
        self._view = ring.view(self.offset, self.nbytes)
        self._free = free

    def install(self, cache: PagedKVCache, blocks: list[int], keep_from: int = 0) -> None:
        install_blocks(cache, blocks, self._view, keep_from)

    def payload(self) -> memoryview:
        return memoryview(bytearray(self._view))

    def release(self) -> None:
        """Drop the view and tell the worker the slot is free."""
        self._view.release()
        self._free({"op": "free", "shm": [self.offset, self.nbytes]})


class RingWriter:
    """The prefill worker's side of the ring: takes slots in order, waits when full.

    Args:
        name, size_bytes: the ring (``ShmRing.spec``).
        cache: the worker's paged cache (its blocks' size sets ``max_blocks``).

    Raises:
        ValueError: the ring holds no whole block.
    """

    def __init__(self, name: str, size_bytes: int, cache: PagedKVCache) -> None:
        self.cache = cache
        self.block_bytes = block_bytes(cache)
        self.max_blocks = size_bytes // self.block_bytes
        if self.max_blocks < 1:
            raise ValueError(f"a {size_bytes}-byte ring holds no {self.block_bytes}-byte block")
        self._shm = shared_memory.SharedMemory(name=name)
        # the decode side owns the segment: this process's exit must not unlink it
        resource_tracker.unregister(self._shm._name, "shared_memory")  # type: ignore[attr-defined]
        self.size_bytes = size_bytes
        self._used: deque[tuple[int, int]] = deque()  # (offset, bytes), oldest first
        self._head = 0
        self._cond = threading.Condition()
        self._closed = False

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None, cache: PagedKVCache) -> RingWriter | None:
        """The ring a worker's spec names (``ShmRing.spec``), or None (the socket)."""
        return None if not spec else cls(spec["name"], spec["bytes"], cache)

    def _fit(self, nbytes: int) -> int | None:
        if not self._used:
            return 0
        tail = self._used[0][0]
        if self._head > tail:  # used: [tail, head); free: after head, and before tail
            if self.size_bytes - self._head >= nbytes:
                return self._head
            return 0 if tail >= nbytes else None
        return self._head if tail - self._head >= nbytes else None  # free: [head, tail)

    def reserve(self, nbytes: int) -> int | None:
        """A slot of ``nbytes`` (at most the ring's size), waiting for space; None once
        closed."""
        with self._cond:
            while not self._closed and (offset := self._fit(nbytes)) is None:
                self._cond.wait()
            if self._closed:
                return None
            self._used.append((offset, nbytes))
            self._head = offset + nbytes
            return offset

    def release(self, offset: int, nbytes: int) -> None:
        """The decode side freed the oldest slot.

        Raises:
            ValueError: it is not the oldest slot (the protocol is broken).
        """
        with self._cond:
            if not self._used or self._used[0] != (offset, nbytes):
                raise ValueError(f"a free of slot {offset}+{nbytes} out of order")
            self._used.popleft()
            self._cond.notify_all()

    def send_blocks(self, outbox: Outbox, blocks: list[int], header: dict[str, Any]) -> None:
        """Pack ``blocks`` (the prompt's blocks ``header["first"]`` on) into slots and put
        one ``blocks`` message per slot on ``outbox``; nothing once the ring is closed."""
        first = header["first"]
        for at in range(0, len(blocks), self.max_blocks):
            part = blocks[at : at + self.max_blocks]
            nbytes = len(part) * self.block_bytes
            offset = self.reserve(nbytes)
            if offset is None or not self._pack(part, offset, nbytes):
                return
            outbox.put({**header, "first": first + at, "count": len(part),
                        "shm": [offset, nbytes]})

    def _pack(self, blocks: list[int], offset: int, nbytes: int) -> bool:
        """Copy ``blocks`` into the slot at ``offset`` (under the lock ``close`` takes, so
        the ring is never unmapped mid-copy); False once closed."""
        k0 = self.cache.k[0]
        shape = (2, len(self.cache.k), len(blocks), *k0.shape[1:])
        with self._cond:
            if self._closed:
                return False
            out = torch.frombuffer(self._shm.buf, dtype=torch.uint8, count=nbytes,
                                   offset=offset).view(k0.dtype).view(shape)
            pack_blocks(self.cache, blocks, out=out)
            del out  # no view of the segment outlives the copy
        return True

    def close(self) -> None:
        """Wake a waiting ``reserve`` (it gives up) and unmap the ring (never unlinked
        here). Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            with contextlib.suppress(BufferError):
                self._shm.close()


KV_CHANNELS = ("socket", "shm")
"""How K/V blocks travel (``DisaggEngine.kv_channel``): a socket payload, or shared memory."""


def check_channel(kv_channel: str, size_bytes: int, cache: PagedKVCache) -> None:
    """Check a decode side's ``kv_channel`` and, for ``shm``, its ring's size.

    Raises:
        ValueError: an unknown channel, or a ring that holds no block of ``cache``.
    """
    if kv_channel not in KV_CHANNELS:
        raise ValueError(f"kv_channel must be one of {KV_CHANNELS}, got {kv_channel!r}")
    if kv_channel == "shm" and size_bytes < block_bytes(cache):
        raise ValueError(f"a {size_bytes}-byte ring holds no {block_bytes(cache)}-byte block")


def blocks_source(ring: ShmRing | None, sock: Any, header: dict[str, Any], nbytes: int,
                  free: Any) -> ShmBlocks | SocketBlocks:
    """Where a ``blocks`` message's K/V is: a slot of ``ring`` (its header names one;
    ``free`` sends the slot's ``free`` message) or the ``nbytes`` on ``sock``.

    Raises:
        ValueError: a slot without a ring, a slot outside it, or a slot and a payload.
    """
    if "shm" not in header:
        return SocketBlocks(sock, nbytes)
    if ring is None or nbytes:
        raise ValueError("a shared-memory blocks message on a socket channel, or with bytes")
    return ShmBlocks(ring, header, free)
