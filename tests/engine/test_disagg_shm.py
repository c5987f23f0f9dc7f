"""The shared-memory K/V channel (``kv_channel="shm"``): a real prefill worker process packs
its blocks into a ring in /dev/shm and sends only control messages over the socket.
Outputs equal the co-located engine's in both first-token modes, also through a ring of
one block (every chunk split, the worker waiting for each slot), and no segment is left
in /dev/shm after a stop or after the worker is killed; ``ttft serve`` refuses
``--kv-channel`` without ``--disaggregate``."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import threading

import pytest
from _live import wait_until

from ttft.engine import Engine, EngineConfig, EngineStopped, ModelConfig, Tokenizer, Transformer
from ttft.engine.disagg import DisaggEngine, decode
from ttft.engine.disagg.channel import block_bytes
from ttft.engine.disagg.shm import blocks_source
from ttft.engine.sampler import SamplingParams

CONFIG = EngineConfig(num_blocks=96, block_size=16, chunk_size=32, max_batch_tokens=64)
REQUESTS = [  # (prompt, sampling): two chunks greedy, one block seeded, a prefix hit
    ("Once upon a time a small fox ran over the hill to see the sea. " * 3, SamplingParams()),
    ("The cat sat.", SamplingParams(temperature=0.9, seed=11)),
    ("Once upon a time a small fox ran over the hill to see the sea. " * 3, SamplingParams()),
]
SHM_DIR = "/dev/shm"


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """The tiny model (read only: every engine of the module shares it) and its tokenizer,
    loaded into a tokenizer cache of the module's that the workers inherit; no engine
    measures the device's peaks."""
    config = ModelConfig.preset("tiny")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("TTFT_CACHE_DIR", str(tmp_path_factory.mktemp("cache"))),
                            ("TTFT_SKIP_PEAKS", "1")):
            mp.setenv(name, value)
        yield (Transformer.from_config(config, seed=0),
               Tokenizer.load(vocab_size=config.vocab_size))


def _shm(parts: tuple[Transformer, Tokenizer], first_token: str = "decode", **kw
         ) -> DisaggEngine:
    return DisaggEngine(*parts, CONFIG, first_token=first_token, kv_channel="shm",
                        measure_peaks=False, **kw)


def _segment(engine: DisaggEngine) -> str:
    return os.path.join(SHM_DIR, engine.worker.spec["shm"]["name"])


async def _run_all(engine: Engine) -> list[list[int]]:
    out = []
    for prompt, sampling in REQUESTS:
        out.append([e.token_id async for e in await engine.submit(prompt, 8, sampling)])
    return out


@pytest.fixture(scope="module")
def expected(parts):
    engine = Engine(*parts, CONFIG, measure_peaks=False).start()
    try:
        yield asyncio.run(_run_all(engine))
    finally:
        engine.stop()


@pytest.mark.parametrize("first_token", ["decode", "prefill"])
def test_shm_outputs_equal_colocated_and_nothing_is_left(parts, expected, first_token):
    engine = _shm(parts, first_token).start()
    segment = _segment(engine)
    try:
        assert os.path.exists(segment)  # the ring, while it serves
        assert asyncio.run(_run_all(engine)) == expected  # greedy and seeded, token for token
        meta = engine.run_metadata()["engine"]["disaggregated"]
        assert (meta["channel"], meta["first_token"]) == ("shm", first_token)
    finally:
        engine.stop()
    assert engine.worker.proc.poll() == 0  # a clean stop
    assert not os.path.exists(segment)


def test_a_ring_of_one_block_splits_every_chunk(parts, expected, monkeypatch):
    seen: list[tuple[str, int]] = []  # (op, slot bytes) of each message the receiver read

    def spy(ring, sock, header, nbytes, free):
        seen.append((header["op"], header.get("shm", [0, -nbytes])[1]))
        return blocks_source(ring, sock, header, nbytes, free)

    monkeypatch.setattr(decode, "blocks_source", spy)
    probe = _shm(parts)
    one = block_bytes(probe.cache)
    engine = _shm(parts, shm_bytes=one).start()  # a chunk is 2 blocks: split, each slot waited for
    try:
        assert asyncio.run(_run_all(engine)) == expected
    finally:
        engine.stop()
    assert not os.path.exists(_segment(engine))
    sizes = [n for op, n in seen if op == "blocks"]
    n_blocks = sum(-(-len(probe.tokenizer.encode(p)) // 16) for p, _ in REQUESTS[:2])
    assert sizes == [one] * len(sizes) and len(sizes) >= n_blocks  # all through the ring
    with pytest.raises(ValueError, match="holds no"):
        _shm(parts, shm_bytes=one - 1)
    with pytest.raises(ValueError, match="kv_channel"):
        DisaggEngine(*parts, CONFIG, kv_channel="pigeon")


def test_a_killed_worker_leaves_no_segment_and_fails_its_request(parts):
    stuck = dataclasses.replace(CONFIG, inject_delay_ms={"kv_transfer": 60e3})
    engine = DisaggEngine(*parts, stuck, kv_channel="shm", measure_peaks=False).start()
    segment, outcome = _segment(engine), []

    def wait_for_it() -> None:
        async def one() -> None:
            try:
                _ = [e async for e in await engine.submit("Hello there", 4)]
                outcome.append("finished")
            except EngineStopped as exc:
                outcome.append(str(exc))

        asyncio.run(one())

    waiter = threading.Thread(target=wait_for_it)
    try:
        waiter.start()
        assert wait_until(lambda: engine.num_running == 1, 20)
        engine.worker.proc.kill()
        waiter.join(20)
        assert not waiter.is_alive()
        assert outcome and "prefill worker is gone" in outcome[0]
        assert wait_until(lambda: not os.path.exists(segment), 10)  # before any stop
    finally:
        engine.stop()
    assert engine.worker.proc.poll() == -signal.SIGKILL
    assert not os.path.exists(segment)


@pytest.mark.parametrize(("args", "message"), [
    (["--kv-channel", "shm"], "--kv-channel needs --disaggregate"),
    (["--disaggregate", "--kv-channel", "pigeon"], "expected socket or shm"),
])
def test_ttft_serve_refuses_a_bad_kv_channel(args, message):
    cmd = [sys.executable, "-m", "ttft.reports.cli", "serve", "--port", "0", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr
