"""Disaggregated prefill and decode: K/V transfer bandwidth against loopback, and TTFT
co-located against disaggregated.

    python benchmarks/disagg.py [--preset small] [--lengths 256 1024] [--requests 5]
                                [--mib 64] [--repeats 5]

Bandwidth: a child process receives over a TCP socket on 127.0.0.1, side by side in the
same run, interleaved ``--repeats`` times so a slow spell of a shared machine falls on
both alike: (1) loopback copy, ``--mib`` MiB sent with ``sendall`` from one buffer and
received with ``recv_into`` one preallocated buffer, the most a socket on this machine
moves; (2) the K/V channel of ``ttft serve --disaggregate`` (``ttft.engine.disagg.channel``)
moving the same bytes as blocks of the preset's paged cache, 16 blocks a message as a
256-token chunk sends them: packed from one cache (``pack_blocks``), framed, sent,
received straight into the child's cache (``recv_blocks``); (3) the shared-memory
channel (``--kv-channel shm``, ``ttft.engine.disagg.shm``) moving the same blocks: a
second child, the prefill side, packs them from its cache into a ring this process made
(``RingWriter.send_blocks``) and sends only control messages; this process installs each
slot into its cache and frees it (flow control as served). (1) and (2) are timed from the
first byte sent to the receiver's acknowledgement of the last, (3) from the request to the
last block installed; the goal is each channel at >= 50 % of loopback (medians).

TTFT: the same engine configuration co-located (``Engine``) and disaggregated
(``DisaggEngine``: a prefill worker process, the first token delivered from the decode
side after the transfer), ``--requests`` requests one at a time per prompt length, each a
fresh random prompt (no prefix-cache hit), from ``submit`` to the first token event; the
median, and the disaggregated overhead. Prints a table; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing as mp
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time

import torch

from ttft.engine import Engine, EngineConfig, ModelConfig, PagedKVCache, Tokenizer, Transformer
from ttft.engine.disagg import DisaggEngine
from ttft.engine.disagg.channel import (
    Outbox,
    block_bytes,
    pack_blocks,
    recv,
    recv_blocks,
    recv_header,
    send,
)
from ttft.engine.disagg.shm import RingWriter, ShmRing, blocks_source

BLOCKS_PER_MESSAGE = 16
GOAL_FRACTION = 0.50


def _cache(config: ModelConfig, num_blocks: int, fill: bool = False) -> PagedKVCache:
    cache = PagedKVCache(config.n_layer, config.n_kv_head, config.head_dim, num_blocks)
    for layer in range(config.n_layer) if fill else ():
        cache.k[layer].normal_()
        cache.v[layer].normal_()
    return cache


def _shm_sender(port: int, preset: str) -> None:
    """The shm run's prefill side (``--shm-sender PORT``, a process of its own so its view
    of the ring is its own, as a prefill worker's is): on each ``go``, ``messages`` blocks
    messages through the ring named in the first message, then ``end``."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    cache = _cache(ModelConfig.preset(preset), BLOCKS_PER_MESSAGE, fill=True)
    spec, _ = recv(sock)
    ring = RingWriter(spec["name"], spec["bytes"], cache)
    outbox, runs = Outbox(sock), queue.SimpleQueue()

    def control() -> None:  # frees and requests, while the main thread sends
        while (header := recv(sock)[0])["op"] != "quit":
            if header["op"] == "free":
                ring.release(*header["shm"])
            else:
                runs.put(header["messages"])
        runs.put(None)

    threading.Thread(target=control, daemon=True).start()
    blocks = list(range(BLOCKS_PER_MESSAGE))
    while (messages := runs.get()) is not None:
        for _ in range(messages):
            ring.send_blocks(outbox, blocks, {"op": "blocks", "first": 0})
        outbox.put({"op": "end"})
    ring.close()
    outbox.close()
    sock.close()


def _shm_start(preset: str) -> tuple[subprocess.Popen, socket.socket, ShmRing]:
    """The shm run's sender process, its control socket, and the ring it is told of."""
    listener = socket.create_server(("127.0.0.1", 0))
    child = subprocess.Popen([sys.executable, __file__, "--shm-sender",
                              str(listener.getsockname()[1]), "--preset", preset])
    listener.settimeout(60)
    sock, _ = listener.accept()
    listener.close()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ring = ShmRing()
    send(sock, ring.spec())
    return child, sock, ring


def _shm_round(sock: socket.socket, ring: ShmRing, cache: PagedKVCache, messages: int) -> float:
    """Bytes/s of one run of the shared-memory channel: ``messages`` blocks messages,
    each slot installed into ``cache`` and freed, from the request to the last install."""
    blocks, total = list(range(BLOCKS_PER_MESSAGE)), 0
    t0 = time.perf_counter()
    send(sock, {"op": "go", "messages": messages})
    while (header := recv_header(sock))[0]["op"] != "end":
        source = blocks_source(ring, sock, *header, lambda h: send(sock, h))
        source.install(cache, blocks)
        source.release()
        total += source.nbytes
    return total / (time.perf_counter() - t0)


def _receiver(port: int, config_fields: dict, total_bytes: int) -> None:
    """The child: receive one run (``raw`` bytes or ``kv`` blocks), acknowledge, repeat."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    config = ModelConfig(**config_fields)
    cache = _cache(config, 2 * BLOCKS_PER_MESSAGE)
    buf = memoryview(bytearray(total_bytes))
    while True:
        head = sock.recv(1)
        if not head or head == b"q":
            return
        if head == b"r":  # raw: exactly total_bytes
            got = 0
            while got < total_bytes:
                got += sock.recv_into(buf[got:], total_bytes - got)
        else:  # kv: block messages until an empty one
            while True:
                header, n = recv_header(sock)
                if not header.get("count"):
                    break
                recv_blocks(sock, n, cache, list(range(header["count"])))
        sock.sendall(b"k")


def _bandwidths(preset: str, mib: int, repeats: int) -> tuple[list[float], ...]:
    """(loopback, socket channel, shm channel) bytes/s, ``repeats`` interleaved runs each."""
    config = ModelConfig.preset(preset)
    cache = _cache(config, BLOCKS_PER_MESSAGE, fill=True)
    per_message = BLOCKS_PER_MESSAGE * block_bytes(cache)
    messages = max(1, mib * (1 << 20) // per_message)
    total = messages * per_message
    listener = socket.create_server(("127.0.0.1", 0))
    fields = dataclasses.asdict(config)
    child = mp.get_context("spawn").Process(
        target=_receiver, args=(listener.getsockname()[1], fields, total))
    child.start()
    sock, _ = listener.accept()
    listener.close()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    raw = memoryview(os.urandom(total))
    blocks = list(range(BLOCKS_PER_MESSAGE))
    loop_bps, kv_bps, shm_bps = [], [], []
    shm_child, shm_sock, ring = _shm_start(preset)
    shm_cache = _cache(config, BLOCKS_PER_MESSAGE)
    try:
        for _ in range(repeats + 1):  # the first round warms both up and is not counted
            t0 = time.perf_counter()
            sock.sendall(b"r")
            sock.sendall(raw)
            assert sock.recv(1) == b"k"
            loop_bps.append(total / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            sock.sendall(b"k")
            for _ in range(messages):
                send(sock, {"op": "blocks", "count": BLOCKS_PER_MESSAGE},
                     pack_blocks(cache, blocks))
            send(sock, {"op": "blocks", "count": 0})
            assert sock.recv(1) == b"k"
            kv_bps.append(total / (time.perf_counter() - t0))
            shm_bps.append(_shm_round(shm_sock, ring, shm_cache, messages))
        sock.sendall(b"q")
        send(shm_sock, {"op": "quit"})
        shm_child.wait(30)
    finally:
        sock.close()
        child.join(30)
        shm_sock.close()
        ring.close()
        if shm_child.poll() is None:
            shm_child.kill()
    return loop_bps[1:], kv_bps[1:], shm_bps[1:]


async def _ttfts_ms(engine: Engine, length: int, requests: int, vocab: int) -> list[float]:
    gen = torch.Generator().manual_seed(length)
    out = []
    for _ in range(requests):
        ids = torch.randint(3, vocab, (length,), generator=gen).tolist()
        t0 = time.perf_counter()
        stream = await engine.submit(ids, 2)
        async for _ in stream:
            out.append((time.perf_counter() - t0) * 1e3)
            break
        await stream.aclose()
    return out


def _ttft_table(preset: str, lengths: list[int], requests: int) -> list[tuple[int, float, float]]:
    config = ModelConfig.preset(preset)
    tokenizer = Tokenizer.load(vocab_size=config.vocab_size)
    engine_config = EngineConfig(num_blocks=max(256, 4 * max(lengths) // 16 + 64))
    rows: dict[int, list[float]] = {n: [] for n in lengths}
    for make in (Engine, DisaggEngine):
        engine = make(Transformer.from_config(config, seed=0), tokenizer, engine_config,
                      measure_peaks=False).start()
        try:
            for n in lengths:
                asyncio.run(_ttfts_ms(engine, n, 1, config.vocab_size))  # warm-up
                rows[n].append(statistics.median(
                    asyncio.run(_ttfts_ms(engine, n, requests, config.vocab_size))))
        finally:
            engine.stop()
    return [(n, co, dis) for n, (co, dis) in rows.items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shm-sender", type=int, help=argparse.SUPPRESS)  # the shm child
    args = parser.parse_args()
    if args.shm_sender is not None:
        _shm_sender(args.shm_sender, args.preset)
        return 0
    os.environ.setdefault("TTFT_SKIP_PEAKS", "1")
    config = ModelConfig.preset(args.preset)
    loop_bps, kv_bps, shm_bps = _bandwidths(args.preset, args.mib, args.repeats)
    loop_m = statistics.median(loop_bps)
    per_block = 2 * config.n_layer * 16 * config.n_kv_head * config.head_dim * 4
    print(f"K/V transfer over 127.0.0.1, preset {args.preset!r} ({per_block / 1024:.0f} KiB a "
          f"block, {BLOCKS_PER_MESSAGE} blocks a message), {args.mib} MiB x {args.repeats}")
    print(f"  {'path':<44}{'median GB/s':>12}{'min':>8}{'max':>8}{'/ loopback':>12}")
    for name, bps in (("loopback copy (sendall/recv_into)", loop_bps),
                      ("K/V socket channel (pack+send+recv_blocks)", kv_bps),
                      ("K/V shm channel (pack to ring+install)", shm_bps)):
        ratio = statistics.median(bps) / loop_m
        verdict = "" if bps is loop_bps else (" met" if ratio >= GOAL_FRACTION else " missed")
        print(f"  {name:<44}{statistics.median(bps) / 1e9:>12.2f}{min(bps) / 1e9:>8.2f}"
              f"{max(bps) / 1e9:>8.2f}{ratio:>11.0%}{verdict}")
    print(f"  goal: each channel >= {GOAL_FRACTION:.0%} of loopback")
    print(f"\nTTFT, median of {args.requests} requests (ms), preset {args.preset!r}, "
          "first token from the decode side")
    print(f"  {'prompt tokens':>13}{'co-located':>12}{'disaggregated':>15}{'overhead':>10}")
    for n, co, dis in _ttft_table(args.preset, args.lengths, args.requests):
        print(f"  {n:>13}{co:>12.1f}{dis:>15.1f}{dis - co:>+10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
