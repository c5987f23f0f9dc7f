"""Prefill measured apart from decode: the engine's ``prefill_chunk`` alone, at each prompt
length and chunk size, cold and with half the prompt already in the prefix cache, each
chunk timed. Plain data comes back (``PrefillProfile``); turning it into a trace is the
caller's (``ttft profile-prefill``).

Timing: a chunk's interval runs from the host's call into ``prefill_chunk`` to the
device's completion of its work: on CUDA the device is synchronized at every chunk's end
(and is idle at its start), so the interval is device time plus launch overhead, never
host enqueue time alone. Host clock (``clock_ns``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ttft.engine.kv_cache import PagedKVCache, Seq
from ttft.engine.model import ModelConfig, Transformer, prefill, prefill_chunk
from ttft.engine.peaks import measure_peaks
from ttft.engine.prefix_cache import PrefixCache
from ttft.tracer import clock_ns

__all__ = ["TIMING", "ChunkTiming", "PrefillProfile", "ProfileSpec", "TimedRun", "measure_prefill"]

TIMING = "prefill.chunk: host call to device completion (CUDA synchronized at its end)"
"""What a chunk's interval measures, in one line (for a trace's metadata)."""


@dataclass(frozen=True)
class ProfileSpec:
    """What to profile. ``chunk_sizes`` above a length run that length as one chunk."""

    model: str = "small"
    lengths: tuple[int, ...] = (128, 512, 2048)
    chunk_sizes: tuple[int, ...] = (256, 1024)
    prefix_reuse: bool = False
    repeats: int = 3
    warmup: int = 1
    device: str = "cpu"
    seed: int = 0
    block_size: int = 16

    def check(self) -> ModelConfig:
        """The model's config, after checking the spec against it.

        Raises:
            ValueError: an unknown preset, an empty or non-positive length or chunk size,
                a length above the model's ``max_seq_len`` (named), or bad counts.
        """
        config = ModelConfig.preset(self.model)
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"lengths must be positive, got {list(self.lengths)}")
        if not self.chunk_sizes or min(self.chunk_sizes) < 1:
            raise ValueError(f"chunk sizes must be positive, got {list(self.chunk_sizes)}")
        too_long = [n for n in self.lengths if n > config.max_seq_len]
        if too_long:
            raise ValueError(
                f"length(s) {', '.join(map(str, too_long))} exceed the {self.model} model's "
                f"max_seq_len {config.max_seq_len}"
            )
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(
                f"need repeats >= 1 and warmup >= 0, got {self.repeats}, {self.warmup}"
            )
        return config

    def chunks_for(self, tokens: int) -> list[int]:
        """The distinct chunk sizes ``tokens`` to compute run with (a size above it becomes
        ``tokens``: one chunk)."""
        return sorted({min(c, tokens) for c in self.chunk_sizes})

    def cached_for(self, length: int) -> int:
        """Prefix tokens cached in the ``prefix_hit`` condition: half the prompt, in whole
        K/V blocks (the prefix cache keeps full blocks only); 0 when under one block."""
        return length // 2 // self.block_size * self.block_size


@dataclass(frozen=True)
class ChunkTiming:
    """One timed ``prefill_chunk`` call (``clock_ns()`` times; see the module docstring).

    Attributes:
        chunk_tokens: prompt tokens the chunk computed.
        cached_tokens: prompt tokens of the run served from the prefix cache.
        context_tokens: positions in the sequence after the chunk.
    """

    start_ns: int
    end_ns: int
    chunk_tokens: int
    cached_tokens: int
    context_tokens: int


@dataclass(frozen=True)
class TimedRun:
    """One timed prefill of a prompt on a fresh sequence.

    Attributes:
        condition: ``cold`` or ``prefix_hit``.
        length: prompt tokens.
        chunk_size: the chunk size it ran with (at most the tokens it computed).
        cached_tokens: prompt tokens matched in the prefix cache.
        repeat: the round it ran in (0-based).
        chunks: its chunks in order.
    """

    condition: str
    length: int
    chunk_size: int
    cached_tokens: int
    repeat: int
    chunks: tuple[ChunkTiming, ...]


@dataclass(frozen=True)
class PrefillProfile:
    """A finished measurement.

    Attributes:
        spec: what was measured.
        model_config: the model's config with its ``dtype``.
        device: the device and its peaks, measured on this machine (``measure_peaks``).
        runs: every timed run, in the order they ran (warm-up runs are not kept).
        torch_version, threads: torch's version and its CPU threads.
    """

    spec: ProfileSpec
    model_config: dict[str, Any]
    device: dict[str, Any]
    runs: tuple[TimedRun, ...]
    torch_version: str
    threads: int


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_prefill(
    model: Transformer, cache: PagedKVCache, seq: Seq, ids: list[int], chunk: int
) -> tuple[ChunkTiming, ...]:
    """Prefill ``ids`` from ``seq.length`` on in chunks of ``chunk``, timing each."""
    device = model.device
    cached = seq.length
    out = []
    _sync(device)
    for pos in range(cached, len(ids), chunk):
        piece = ids[pos : pos + chunk]
        t0_ns = clock_ns()
        prefill_chunk(model, cache, seq, piece)
        _sync(device)
        out.append(ChunkTiming(t0_ns, clock_ns(), len(piece), cached, seq.length))
    return tuple(out)


def _one_run(
    model: Transformer,
    cache: PagedKVCache,
    prefix_cache: PrefixCache,
    ids: list[int],
    chunk: int,
    cached: int,
) -> tuple[ChunkTiming, ...]:
    """One timed prefill of ``ids`` on a fresh sequence, its first ``cached`` tokens
    matched in ``prefix_cache``; the sequence's blocks are freed after."""
    seq = Seq()
    if cached:
        blocks, matched = prefix_cache.match(ids)
        if matched != cached:
            raise RuntimeError(f"prefix cache matched {matched} tokens, not {cached}")
        prefix_cache.attach(seq, blocks, matched)
    try:
        return _timed_prefill(model, cache, seq, ids, chunk)
    finally:
        cache.free(seq)


def measure_prefill(
    spec: ProfileSpec, on_step: Callable[[str], None] | None = None
) -> PrefillProfile:
    """Measure the prefill profile of ``spec``.

    For each length, its cases are every condition (``cold``, then ``prefix_hit`` with
    `ProfileSpec.cached_for` tokens matched in the engine's prefix cache, when
    ``prefix_reuse``; lengths under two blocks have no ``prefix_hit``) and chunk size
    (`ProfileSpec.chunks_for` the tokens to compute): ``warmup`` untimed runs of each
    case, then ``repeats`` rounds in which every case runs once, timed. Every run prefills
    the same prompt (random ids from ``seed``) on a fresh sequence; the prefix is computed
    once per length, outside any timed run. The device's peaks are measured first.

    Args:
        on_step: called with a short description before each length.

    Raises:
        ValueError: as `ProfileSpec.check`.
    """
    config = spec.check()
    device = torch.device(spec.device)
    model = Transformer.from_config(config, seed=spec.seed, device=device)
    device_info = measure_peaks(device)
    bs = spec.block_size
    cache = PagedKVCache.for_model(model, 2 * -(-max(spec.lengths) // bs) + 1, bs)
    prefix_cache = PrefixCache(cache)
    gen = torch.Generator().manual_seed(spec.seed)
    runs: list[TimedRun] = []
    for length in spec.lengths:
        ids = torch.randint(0, config.vocab_size, (length,), generator=gen).tolist()
        half = spec.cached_for(length) if spec.prefix_reuse else 0
        if half:
            seq = cache.allocate()
            prefill(model, cache, ids[:half], seq=seq)
            prefix_cache.insert(ids[:half], seq)
            cache.free(seq)
        cases = [
            (condition, cached, chunk)
            for condition, cached in (("cold", 0), ("prefix_hit", half))[: 2 if half else 1]
            for chunk in spec.chunks_for(length - cached)
        ]
        if on_step is not None:
            on_step(f"length {length}: {len(cases)} case(s)")
        for _, cached, chunk in cases:
            for _ in range(spec.warmup):
                _one_run(model, cache, prefix_cache, ids, chunk, cached)
        # Cases take turns, so a slow spell of a shared machine falls on all of them alike.
        for repeat in range(spec.repeats):
            for condition, cached, chunk in cases:
                timed = _one_run(model, cache, prefix_cache, ids, chunk, cached)
                runs.append(TimedRun(condition, length, chunk, cached, repeat, timed))
        prefix_cache.clear()
    model_config = {
        **dataclasses.asdict(config),
        "dtype": str(model.dtype).removeprefix("torch."),
    }
    return PrefillProfile(
        spec, model_config, device_info, tuple(runs), torch.__version__, torch.get_num_threads()
    )
