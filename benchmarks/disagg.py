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
received straight into the child's cache (``recv_blocks``). Each is timed from
the first byte sent to the receiver's acknowledgement of the last; the goal is the channel
at >= 50 % of loopback (medians).

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
import socket
import statistics
import time

import torch

from ttft.engine import Engine, EngineConfig, ModelConfig, PagedKVCache, Tokenizer, Transformer
from ttft.engine.disagg import DisaggEngine
from ttft.engine.disagg.channel import block_bytes, pack_blocks, recv_blocks, recv_header, send

BLOCKS_PER_MESSAGE = 16
GOAL_FRACTION = 0.50


def _cache(config: ModelConfig, num_blocks: int) -> PagedKVCache:
    return PagedKVCache(config.n_layer, config.n_kv_head, config.head_dim, num_blocks)


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


def _bandwidths(config: ModelConfig, mib: int, repeats: int) -> tuple[list[float], list[float]]:
    """(loopback, channel) bytes/s, ``repeats`` interleaved runs each."""
    cache = _cache(config, BLOCKS_PER_MESSAGE)
    for layer in range(config.n_layer):
        cache.k[layer].normal_()
        cache.v[layer].normal_()
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
    loop_bps, kv_bps = [], []
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
        sock.sendall(b"q")
    finally:
        sock.close()
        child.join(30)
    return loop_bps[1:], kv_bps[1:]


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
    args = parser.parse_args()
    os.environ.setdefault("TTFT_SKIP_PEAKS", "1")
    config = ModelConfig.preset(args.preset)
    loop_bps, kv_bps = _bandwidths(config, args.mib, args.repeats)
    loop_m, kv_m = statistics.median(loop_bps), statistics.median(kv_bps)
    per_block = 2 * config.n_layer * 16 * config.n_kv_head * config.head_dim * 4
    print(f"K/V transfer over 127.0.0.1, preset {args.preset!r} ({per_block / 1024:.0f} KiB a "
          f"block, {BLOCKS_PER_MESSAGE} blocks a message), {args.mib} MiB x {args.repeats}")
    print(f"  {'path':<34}{'median GB/s':>12}{'min':>8}{'max':>8}")
    for name, bps in (("loopback copy (sendall/recv_into)", loop_bps),
                      ("K/V channel (pack+send+recv_blocks)", kv_bps)):
        print(f"  {name:<34}{statistics.median(bps) / 1e9:>12.2f}"
              f"{min(bps) / 1e9:>8.2f}{max(bps) / 1e9:>8.2f}")
    ratio = kv_m / loop_m
    verdict = "met" if ratio >= GOAL_FRACTION else "missed"
    print(f"  channel / loopback: {ratio:.0%} (goal >= {GOAL_FRACTION:.0%}: {verdict})")
    print(f"\nTTFT, median of {args.requests} requests (ms), preset {args.preset!r}, "
          "first token from the decode side")
    print(f"  {'prompt tokens':>13}{'co-located':>12}{'disaggregated':>15}{'overhead':>10}")
    for n, co, dis in _ttft_table(args.preset, args.lengths, args.requests):
        print(f"  {n:>13}{co:>12.1f}{dis:>15.1f}{dis - co:>+10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
