"""The prefill profile, measured apart from decode (``ttft profile-prefill``): the engine's
``prefill_chunk`` alone, at each prompt length and chunk size, cold and with half the
prompt already in the prefix cache, written as a trace and summarized per length.

Every timed run is one trace: a ``prefill`` envelope with a ``prefill.chunk`` child per
chunk (attributes ``step_id``, ``chunk_tokens``, ``cached_tokens``, ``context_tokens`` as
the engine records them), so ``analysis.prefill`` and ``analysis.regime`` read it as they read
an engine's trace (it holds no TTFT window: there is no request around a prefill). The run
metadata holds ``model_config`` (with ``dtype``) and ``device`` (peaks measured on this
machine by ``ttft.engine.peaks``), which ``ttft.analysis.regime`` needs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import torch

from ttft.analysis.prefill import QuadraticFit, fit_quadratic, prefill_points
from ttft.analysis.regime import ModelShape, Peaks, find_peaks, regime
from ttft.collectors.store import to_span_table
from ttft.engine.kv_cache import PagedKVCache, Seq
from ttft.engine.model import ModelConfig, Transformer, prefill, prefill_chunk
from ttft.engine.peaks import measure_peaks
from ttft.engine.prefix_cache import PrefixCache
from ttft.tracer import clock_ns

__all__ = ["DEFAULT_LENGTHS", "ProfileRun", "ProfileSpec", "profile_summary", "run_profile"]

DEFAULT_LENGTHS = (128, 512, 2048, 4096)
SERVICE = "ttft-profile"
RUN_COLUMNS = ("trace_id", "condition", "length", "chunk_size", "cached_tokens", "repeat")


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


@dataclass
class ProfileRun:
    """A finished profile: the span table, its run metadata and one row per timed run
    (`RUN_COLUMNS`; warm-up runs are not recorded)."""

    table: pa.Table
    metadata: dict[str, Any]
    runs: pd.DataFrame


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Spans:
    """Span rows of the profile, one trace per timed run."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.clock = f"host:{socket.gethostname()}"
        self.step_ids = 0

    def _add(self, trace_id: str, name: str, start_ns: int, end_ns: int, parent: str | None,
             request_id: str, attributes: dict[str, Any]) -> str:  # fmt: skip
        span_id = os.urandom(8).hex()
        row = dict(trace_id=trace_id, span_id=span_id, parent_id=parent, request_id=request_id,
                   name=name, stage=name, start_ns=start_ns, end_ns=end_ns, clock=self.clock,
                   service=SERVICE, attributes=json.dumps(attributes))  # fmt: skip
        self.rows.append(row)
        return span_id

    def run(
        self,
        timed: list[tuple[int, int, dict[str, int]]],
        length: int,
        chunk: int,
        condition: str,
        repeat: int,
    ) -> tuple[Any, ...]:
        """Record one timed run as a trace: the ``prefill`` envelope and its chunks (each
        its own ``step_id``). Returns the run's row (`RUN_COLUMNS`)."""
        trace_id = os.urandom(16).hex()
        rid = f"prefill-{length}-{chunk}-{condition}-{repeat}"
        cached = timed[0][2]["cached_tokens"]
        envelope = dict(prompt_tokens=length, cached_tokens=cached, chunks=len(timed),
                        chunk_size=chunk, condition=condition, repeat=repeat)  # fmt: skip
        parent = self._add(trace_id, "prefill", timed[0][0], timed[-1][1], None, rid, envelope)
        for t0_ns, t1_ns, attrs in timed:
            attrs = {"step_id": self.step_ids, **attrs}
            self._add(trace_id, "prefill.chunk", t0_ns, t1_ns, parent, rid, attrs)
            self.step_ids += 1
        return trace_id, condition, length, chunk, cached, repeat


def _timed_prefill(
    model: Transformer, cache: PagedKVCache, seq: Seq, ids: list[int], chunk: int
) -> list[tuple[int, int, dict[str, int]]]:
    """Prefill ``ids`` from ``seq.length`` on in chunks, timing each chunk.

    Each chunk's interval runs from the host's call into ``prefill_chunk`` to the device's
    completion of its work: on CUDA the device is synchronized at every chunk's end (and is
    idle at its start), so the interval is device time plus launch overhead, never host
    enqueue time alone. Host clock (``clock_ns``).
    """
    device = model.device
    cached = seq.length
    out = []
    _sync(device)
    for pos in range(cached, len(ids), chunk):
        piece = ids[pos : pos + chunk]
        t0_ns = clock_ns()
        prefill_chunk(model, cache, seq, piece)
        _sync(device)
        t1_ns = clock_ns()
        attrs = dict(chunk_tokens=len(piece), cached_tokens=cached, context_tokens=seq.length)
        out.append((t0_ns, t1_ns, attrs))
    return out


def _one_run(
    model: Transformer,
    cache: PagedKVCache,
    prefix_cache: PrefixCache,
    ids: list[int],
    chunk: int,
    cached: int,
) -> list[tuple[int, int, dict[str, int]]]:
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


def run_profile(spec: ProfileSpec, on_step: Callable[[str], None] | None = None) -> ProfileRun:
    """Run the profile. For each length, its cases are every condition (``cold``, then
    ``prefix_hit`` with `ProfileSpec.cached_for` tokens matched in the engine's prefix
    cache, when ``prefix_reuse``; lengths under two blocks have no ``prefix_hit``) and
    chunk size (`ProfileSpec.chunks_for` the tokens to compute): ``warmup`` untimed runs
    of each case, then ``repeats`` rounds in which every case runs once, timed. Every run
    prefills the same prompt (random ids from ``seed``) on a fresh sequence; the prefix is
    computed once per length, outside any timed run. The device's peaks are measured first
    (``measure_peaks``).

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
    spans, runs = _Spans(), []
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
                runs.append(spans.run(timed, length, chunk, condition, repeat))
        prefix_cache.clear()
    metadata = {
        "tool": "ttft profile-prefill",
        "model": spec.model,
        "model_config": {
            **dataclasses.asdict(config),
            "dtype": str(model.dtype).removeprefix("torch."),
        },
        "device": device_info,
        "lengths": list(spec.lengths),
        "chunk_sizes": list(spec.chunk_sizes),
        "prefix_reuse": spec.prefix_reuse,
        "repeats": spec.repeats,
        "warmup": spec.warmup,
        "seed": spec.seed,
        "block_size": bs,
        "timing": "prefill.chunk: host call to device completion (CUDA synchronized at its end)",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    frame = pd.DataFrame(runs, columns=list(RUN_COLUMNS))
    return ProfileRun(to_span_table(spans.rows), metadata, frame)


def profile_summary(
    run: ProfileRun,
) -> tuple[pd.DataFrame, dict[tuple[str, int], QuadraticFit | None], Peaks | None]:
    """Per (condition, length, chunk size): the median over repeats of the run's compute
    time (its chunks' durations summed, ``analysis.prefill``), tokens/s of the tokens it
    computed, its FLOPs, FLOP/s, intensity, bound and roofline fraction (from
    ``analysis.regime`` over the trace, against the metadata's measured peaks); and the
    quadratic fit ``time ≈ a + b·n + c·n²`` (n = computed tokens, every timed run a point)
    per condition and requested chunk size, over the runs that used that chunk size (or
    the whole prompt, when shorter); None where it has under 3 distinct lengths.

    Returns:
        ``(rows, fits, peaks)``.
    """
    peaks = find_peaks(run.metadata)
    shape = ModelShape.from_dict(run.metadata["model_config"])
    frame = regime(run.table, shape, peaks)
    per_trace = frame.groupby("trace_id")[["flops", "bytes"]].sum()
    points = prefill_points(run.table).set_index("trace_id")
    runs = run.runs.join(per_trace, on="trace_id").join(
        points[["computed_tokens", "compute_ns"]], on="trace_id"
    )
    rows = []
    for (condition, length, chunk), g in runs.groupby(
        ["condition", "length", "chunk_size"], sort=False
    ):
        time_ns = float(statistics.median(g["compute_ns"]))
        flops, nbytes = float(g["flops"].iloc[0]), float(g["bytes"].iloc[0])
        computed = int(g["computed_tokens"].iloc[0])
        achieved = flops / (time_ns / 1e9) if time_ns > 0 else float("nan")
        intensity = flops / nbytes
        row = dict(
            condition=condition,
            length=length,
            chunk_size=chunk,
            cached_tokens=int(g["cached_tokens"].iloc[0]),
            computed_tokens=computed,
            runs=len(g),
            time_ns=time_ns,
            tokens_per_s=computed / (time_ns / 1e9) if time_ns > 0 else float("nan"),
            flops=flops,
            flops_per_s=achieved,
            intensity=intensity,
            bound=None,
            roofline_fraction=float("nan"),
        )
        if peaks is not None:
            attainable = min(peaks.flops_per_s, intensity * peaks.bytes_per_s)
            row["bound"] = "compute" if intensity >= peaks.ridge else "memory"
            row["roofline_fraction"] = achieved / attainable
        rows.append(row)
    fits: dict[tuple[str, int], QuadraticFit | None] = {}
    todo = runs["length"] - runs["cached_tokens"]
    for condition in runs["condition"].unique():
        for c in run.metadata["chunk_sizes"]:
            pick = runs[
                (runs["condition"] == condition) & (runs["chunk_size"] == todo.clip(upper=c))
            ]
            fits[(condition, c)] = fit_quadratic(pick["computed_tokens"], pick["compute_ns"])
    return pd.DataFrame(rows), fits, peaks
