"""The channel between a prefill worker and the decode side: framed messages over one
connected stream socket (TCP on 127.0.0.1 by default), and the K/V blocks as raw bytes.

A message is a JSON header and an optional binary payload, framed as
``!II`` (header bytes, payload bytes), the header, then the payload. Blocks travel as one
contiguous ``(2, n_layer, n_blocks, block_size, n_kv_head, head_dim)`` tensor (K then V,
every layer) in the cache's dtype, sent straight from the tensor's memory and received
into a buffer the decode side views as a tensor: no copy beyond the socket's own.

``Outbox`` is the sending side: one thread writes every message in the order it was put,
so a request's blocks always precede its first token, and a slow socket never blocks the
engine thread that produced them. Reading is the caller's (``recv``), from one thread.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import struct
import threading
from typing import Any

import torch

from ttft.engine.kv_cache import PagedKVCache

__all__ = [
    "ChannelClosed",
    "Outbox",
    "SocketBlocks",
    "block_bytes",
    "install_blocks",
    "pack_blocks",
    "recv",
    "recv_blocks",
    "recv_header",
    "recv_payload",
    "send",
]

log = logging.getLogger(__name__)
_FRAME = struct.Struct("!II")
_STOP = object()


class ChannelClosed(ConnectionError):
    """The other end closed the connection (or it broke)."""


def _recv_into(sock: socket.socket, view: memoryview) -> memoryview:
    n, got = view.nbytes, 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ChannelClosed("the other end closed the channel")
        got += k
    return view


def recv_payload(sock: socket.socket, n: int) -> memoryview:
    """The ``n`` payload bytes that follow a header (in a buffer that is not zeroed first:
    every byte of it is received)."""
    return _recv_into(sock, memoryview(torch.empty(n, dtype=torch.uint8).numpy()))


def recv_header(sock: socket.socket, max_header_bytes: int | None = None
                ) -> tuple[dict[str, Any], int]:
    """The next message's header and the size of its payload, which the caller reads next
    (``recv_payload``, ``recv_blocks``).

    Raises:
        ChannelClosed: the connection ended (also mid-message).
        OSError: the socket failed.
        ValueError: the header is over ``max_header_bytes``, or not a JSON object.
    """
    head_n, body_n = _FRAME.unpack(_recv_into(sock, memoryview(bytearray(_FRAME.size))))
    if max_header_bytes is not None and head_n > max_header_bytes:
        raise ValueError(f"a {head_n:,}-byte header (at most {max_header_bytes:,})")
    header = json.loads(bytes(_recv_into(sock, memoryview(bytearray(head_n)))))
    if not isinstance(header, dict):
        raise ValueError("a header that is not a JSON object")
    return header, body_n


def recv(sock: socket.socket) -> tuple[dict[str, Any], memoryview]:
    """The next message: its header and its payload (empty when it has none).

    Raises:
        ChannelClosed: the connection ended (also mid-message).
        OSError: the socket failed.
    """
    header, body_n = recv_header(sock)
    return header, recv_payload(sock, body_n) if body_n else memoryview(b"")


def send(sock: socket.socket, header: dict[str, Any], payload: Any = None) -> None:
    """Write one message (``payload``: a bytes-like object, a CPU tensor, or None)."""
    head = json.dumps(header, separators=(",", ":")).encode()
    body = memoryview(b"") if payload is None else _as_bytes(payload)
    sock.sendall(_FRAME.pack(len(head), body.nbytes) + head)
    if body.nbytes:
        sock.sendall(body)


def _as_bytes(payload: Any) -> memoryview:
    if isinstance(payload, torch.Tensor):
        flat = payload.detach().contiguous().reshape(-1).view(torch.uint8)
        return memoryview(flat.numpy())
    return memoryview(payload).cast("B")


class Outbox:
    """Messages to one socket, written in order by a thread of their own.

    ``put`` never blocks on the socket; after the socket fails every later message is
    dropped (the reader on the other side sees the connection end). ``close`` writes what
    is queued, then stops the thread (the socket stays open: the caller owns it).
    """

    def __init__(self, sock: socket.socket, name: str = "ttft-outbox") -> None:
        self.sock = sock
        self.broken = False
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, header: dict[str, Any], payload: Any = None) -> None:
        self._queue.put((header, payload))

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            if self.broken:
                continue
            try:
                send(self.sock, *item)
            except OSError as exc:
                log.warning("ttft disagg: channel write failed (%s); dropping messages", exc)
                self.broken = True

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued (at most ``timeout_s``) and stop. Idempotent."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)


def block_bytes(cache: PagedKVCache) -> int:
    """Bytes one block carries: K and V of every layer."""
    k = cache.k[0]
    return 2 * len(cache.k) * k[0].numel() * k.element_size()


def pack_blocks(
    cache: PagedKVCache, blocks: list[int], out: torch.Tensor | None = None
) -> torch.Tensor:
    """A copy of ``blocks`` (all layers, K and V) as one contiguous CPU tensor, shaped
    ``(2, n_layer, len(blocks), block_size, n_kv_head, head_dim)``: the payload of a blocks
    message, safe to send after the blocks are freed or rewritten. With ``out`` (a CPU
    tensor of that shape and the cache's dtype, e.g. a shared-memory slot) the copy is
    written there, straight from a CPU cache, and ``out`` is returned."""
    k0 = cache.k[0]
    shape = (2, len(cache.k), len(blocks), *k0.shape[1:])
    direct = out is not None and out.device == cache.device
    dest = out if direct else torch.empty(shape, dtype=k0.dtype, device=cache.device)
    assert dest is not None and tuple(dest.shape) == shape and dest.dtype == k0.dtype
    run = blocks == list(range(blocks[0], blocks[0] + len(blocks))) if blocks else False
    idx = None if run else torch.tensor(blocks, dtype=torch.long, device=cache.device)
    for side, layers in enumerate((cache.k, cache.v)):
        for i, layer in enumerate(layers):
            if idx is None:  # consecutive ids: a slice
                dest[side, i].copy_(layer[blocks[0] : blocks[0] + len(blocks)])
            else:
                torch.index_select(layer, 0, idx, out=dest[side, i])
    if out is None:
        return dest.cpu()
    if not direct:
        out.copy_(dest)
    return out


def install_blocks(
    cache: PagedKVCache, blocks: list[int], payload: memoryview, keep_from: int = 0
) -> None:
    """Write a blocks message's ``payload`` (``pack_blocks``' layout) into ``blocks``, from
    its ``keep_from``-th block on (the ones before are left as they are).

    Raises:
        ValueError: the payload is not ``len(blocks)`` blocks of this cache's shape.
    """
    k0 = cache.k[0]
    shape = (2, len(cache.k), len(blocks), *k0.shape[1:])
    if payload.nbytes != len(blocks) * block_bytes(cache):
        raise ValueError(f"a blocks payload of {payload.nbytes} bytes is not {shape} {k0.dtype}")
    data = torch.frombuffer(payload, dtype=torch.uint8).view(k0.dtype).view(shape)
    data = data.to(cache.device, non_blocking=False)
    if keep_from >= len(blocks):
        return
    ids = blocks[keep_from:]
    if ids == list(range(ids[0], ids[0] + len(ids))):  # consecutive ids: a slice
        for side, layers in enumerate((cache.k, cache.v)):
            for layer, dest in enumerate(layers):
                dest[ids[0] : ids[0] + len(ids)].copy_(data[side, layer, keep_from:])
        return
    idx = torch.tensor(ids, dtype=torch.long, device=cache.device)
    for layer in range(len(cache.k)):
        cache.k[layer].index_copy_(0, idx, data[0, layer, keep_from:])
        cache.v[layer].index_copy_(0, idx, data[1, layer, keep_from:])


class SocketBlocks:
    """One ``blocks`` message's payload still on the socket, read by the decode side's
    receiver: ``install`` (``recv_blocks``) or ``payload`` (``recv_payload``), exactly
    one of them; ``release`` has nothing to free (``ttft.engine.disagg.shm.ShmBlocks`` has
    the same interface for a shared-memory slot)."""

    def __init__(self, sock: socket.socket, nbytes: int) -> None:
        self.sock, self.nbytes = sock, nbytes

    def install(self, cache: PagedKVCache, blocks: list[int], keep_from: int = 0) -> None:
        recv_blocks(self.sock, self.nbytes, cache, blocks, keep_from)

    def payload(self) -> memoryview:
        return recv_payload(self.sock, self.nbytes)

    def release(self) -> None:
        """Nothing to free: the bytes were read off the socket."""


def recv_blocks(
    sock: socket.socket, n: int, cache: PagedKVCache, blocks: list[int], keep_from: int = 0
) -> None:
    """Receive a blocks payload of ``n`` bytes into ``blocks`` (from the ``keep_from``-th
    on, as ``install_blocks``): straight from the socket into the cache's memory where the
    blocks are consecutive ids of a CPU cache, so the K/V is copied once, by the kernel.

    Raises:
        ValueError: ``n`` is not ``len(blocks)`` blocks of this cache (nothing was read).
        ChannelClosed, OSError: as ``recv_header``.
    """
    if n != len(blocks) * block_bytes(cache):
        raise ValueError(f"a blocks payload of {n} bytes is not {len(blocks)} blocks")
    if cache.device.type != "cpu" or keep_from or blocks != list(
        range(blocks[0], blocks[0] + len(blocks))
    ):
        install_blocks(cache, blocks, recv_payload(sock, n), keep_from)
        return
    for layers in (cache.k, cache.v):
        for layer in layers:
            dest = layer[blocks[0] : blocks[0] + len(blocks)]  # contiguous rows
            _recv_into(sock, memoryview(dest.view(-1).view(torch.uint8).numpy()))
