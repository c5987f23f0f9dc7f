"""The prefill profile as a trace (``ttft profile-prefill``): the measurements of
``ttft.engine.profile`` (the engine's ``prefill_chunk`` alone, at each prompt length and
chunk size, cold and with half the prompt already in the prefix cache) written as spans and
summarized per length.

Every timed run is one trace: a ``prefill`` envelope with a ``prefill.chunk`` child per
chunk (attributes ``step_id``, ``chunk_tokens``, ``cached_tokens``, ``context_tokens`` as
the engine records them), so ``analysis.prefill`` and ``analysis.regime`` read it as they read
an engine's trace (it holds no TTFT window: there is no request around a prefill). The run
metadata holds ``model_config`` (with ``dtype``) and ``device`` (peaks measured on this
machine by ``ttft.engine.peaks``, before the profile and again after it, the best of both),
which ``ttft.analysis.regime`` needs.
"""

from __future__ import annotations

import os
import socket
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa

from ttft.analysis.assemble import assemble
from ttft.analysis.prefill import QuadraticFit, fit_quadratic, prefill_points
from ttft.analysis.regime import (
    ModelShape,
    Peaks,
    RooflineExcess,
    find_peaks,
    regime,
    roofline_excess,
    roofline_place,
)
from ttft.collectors import span_rows, to_span_table
from ttft.engine.peaks import best_peaks, measure_peaks
from ttft.engine.profile import TIMING, PrefillProfile, ProfileSpec, TimedRun, measure_prefill

__all__ = [
    "DEFAULT_LENGTHS",
    "ProfileRun",
    "ProfileSpec",
    "ProfileSummary",
    "profile_summary",
    "run_profile",
]

DEFAULT_LENGTHS = (128, 512, 2048, 4096)
SERVICE = "ttft-profile"
AFTER_BUDGET_S = 1.0  # the peaks measured again after the profile, the machine less busy
RUN_COLUMNS = ("trace_id", "condition", "length", "chunk_size", "cached_tokens", "repeat")


@dataclass
class ProfileRun:
    """A finished profile: the span table, its run metadata and one row per timed run
    (`RUN_COLUMNS`; warm-up runs are not recorded)."""

    table: pa.Table
    metadata: dict[str, Any]
    runs: pd.DataFrame


class _Spans:
    """Span rows of the profile, one trace per timed run."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.clock = f"host:{socket.gethostname()}"
        self.step_ids = 0

    def _add(self, trace_id: str, name: str, start_ns: int, end_ns: int, parent: str | None,
             request_id: str, attributes: dict[str, Any]) -> str:  # fmt: skip
        span_id = os.urandom(8).hex()
        self.rows += span_rows(name, trace_id=trace_id, span_id=span_id, parent_id=parent,
                               start_ns=start_ns, end_ns=end_ns, clock=self.clock,
                               service=SERVICE, attributes=attributes, request_id=request_id)
        return span_id

    def run(self, run: TimedRun) -> tuple[Any, ...]:
        """Record one timed run as a trace: the ``prefill`` envelope and its chunks (each
        its own ``step_id``). Returns the run's row (`RUN_COLUMNS`)."""
        trace_id = os.urandom(16).hex()
        length, chunk, condition, repeat = run.length, run.chunk_size, run.condition, run.repeat
        rid = f"prefill-{length}-{chunk}-{condition}-{repeat}"
        first, last = run.chunks[0], run.chunks[-1]
        envelope = dict(prompt_tokens=length, cached_tokens=first.cached_tokens,
                        chunks=len(run.chunks), chunk_size=chunk, condition=condition,
                        repeat=repeat)  # fmt: skip
        parent = self._add(trace_id, "prefill", first.start_ns, last.end_ns, None, rid, envelope)
        for c in run.chunks:
            attrs = dict(
                step_id=self.step_ids,
                chunk_tokens=c.chunk_tokens,
                cached_tokens=c.cached_tokens,
                context_tokens=c.context_tokens,
            )
            self._add(trace_id, "prefill.chunk", c.start_ns, c.end_ns, parent, rid, attrs)
            self.step_ids += 1
        return trace_id, condition, length, chunk, first.cached_tokens, repeat


def _metadata(profile: PrefillProfile, device: dict[str, Any]) -> dict[str, Any]:
    """The trace's run metadata: the spec, the model config and the measured device."""
    spec = profile.spec
    return {
        "tool": "ttft profile-prefill",
        "model": spec.model,
        "model_config": profile.model_config,
        "device": device,
        "lengths": list(spec.lengths),
        "chunk_sizes": list(spec.chunk_sizes),
        "prefix_reuse": spec.prefix_reuse,
        "repeats": spec.repeats,
        "warmup": spec.warmup,
        "seed": spec.seed,
        "block_size": spec.block_size,
        "timing": TIMING,
        "torch": profile.torch_version,
        "threads": profile.threads,
    }


def run_profile(spec: ProfileSpec, on_step: Callable[[str], None] | None = None) -> ProfileRun:
    """Run the profile (``ttft.engine.profile.measure_prefill``: its cases, warm-up and
    repeats) and write it as spans, one trace per timed run. The device's peaks are
    measured again after it (``AFTER_BUDGET_S``) and the best of both kept
    (``ttft.engine.peaks.best_peaks``): one measurement on a busy machine understates them.

    Args:
        on_step: called with a short description before each length.

    Raises:
        ValueError: as `ProfileSpec.check`.
    """
    profile = measure_prefill(spec, on_step)
    if on_step is not None:
        on_step("measuring the device's peaks again")
    device = best_peaks(profile.device, measure_peaks(spec.device, AFTER_BUDGET_S))
    spans = _Spans()
    runs = [spans.run(run) for run in profile.runs]
    frame = pd.DataFrame(runs, columns=list(RUN_COLUMNS))
    return ProfileRun(to_span_table(spans.rows), _metadata(profile, device), frame)


@dataclass
class ProfileSummary:
    """What ``ttft profile-prefill`` prints (`profile_summary`).

    Attributes:
        rows: per (condition, length, chunk size), the median run.
        fits: per (condition, requested chunk size), the quadratic fit or None.
        peaks: the metadata's peaks, None without any.
        excess: how far the chunks went past those peaks (None when none did).
    """

    rows: pd.DataFrame
    fits: dict[tuple[str, int], QuadraticFit | None]
    peaks: Peaks | None
    excess: RooflineExcess | None


def profile_summary(run: ProfileRun) -> ProfileSummary:
    """Per (condition, length, chunk size): the median over repeats of the run's compute
    time (its chunks' durations summed, ``analysis.prefill``), tokens/s of the tokens it
    computed, its FLOPs, FLOP/s, intensity, bound, roofline fraction and whether it ran
    above its roofline (``analysis.regime.roofline_place`` against the metadata's measured
    peaks: no fraction then); and the quadratic fit ``time ≈ a + b·n + c·n²`` (n =
    computed tokens, every timed run a point) per condition and requested chunk size,
    over the runs that used that chunk size (or the whole prompt, when shorter); None
    where it has under 3 distinct lengths. ``excess`` is ``roofline_excess`` of every
    chunk of the trace.
    """
    peaks = find_peaks(run.metadata)
    shape = ModelShape.from_dict(run.metadata["model_config"])
    asm = assemble(run.table)
    frame = regime(asm, shape, peaks)
    per_trace = frame.groupby("trace_id")[["flops", "bytes"]].sum()
    points = prefill_points(asm).set_index("trace_id")
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
            **roofline_place(peaks, intensity, achieved),
        )
        rows.append(row)
    fits: dict[tuple[str, int], QuadraticFit | None] = {}
    todo = runs["length"] - runs["cached_tokens"]
    for condition in runs["condition"].unique():
        for c in run.metadata["chunk_sizes"]:
            pick = runs[
                (runs["condition"] == condition) & (runs["chunk_size"] == todo.clip(upper=c))
            ]
            fits[(condition, c)] = fit_quadratic(pick["computed_tokens"], pick["compute_ns"])
    return ProfileSummary(pd.DataFrame(rows), fits, peaks, roofline_excess(frame, peaks))
