"""Prefill regime: per ``prefill.chunk``, FLOPs and bytes moved from the model's shape,
arithmetic intensity, and against the traced device's roofline whether the chunk was
compute- or memory-bound and what fraction of the attainable FLOP/s it achieved;
`compute_regime` does it for a trace, finding its model and peaks.

A chunk cannot beat its roofline. One that does (achieved above its attainable) proves the
peaks too low (measured under load) or the cost model too generous (a wrong model config):
it gets no fraction (``roofline_fraction`` NaN, ``above_roofline`` True), and
`roofline_excess` says how far the trace went past the peaks, so a report never prints a
percentage over 100% nor a peak below what the trace achieved.

The model's shape, the device's peaks and where a trace says them (`ModelShape`, `Peaks`,
`find_peaks`, `find_model_and_device`) are defined in ``analysis._model_device`` and
exported here. Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ttft.analysis import _column_arrays as col
from ttft.analysis._gpus import KNOWN_GPUS, KnownGpu, known_gpu
from ttft.analysis._model_device import (
    ENGINE_INFO,
    ModelShape,
    Peaks,
    find_model_and_device,
    find_peaks,
)
from ttft.analysis._request_columns import request_columns
from ttft.analysis.assemble import Assembly
from ttft.analysis.order_stats import InMemory, PartSet
from ttft.analysis.roofline import (
    SUMMARY_COLUMNS,
    RooflineExcess,
    chunk_bucket,
    regime_figures,
    regime_summary,
    roofline_excess,
    roofline_place,
)
from ttft.tracer.schema import ATTR_CACHED_TOKENS, ATTR_CHUNK_TOKENS, ATTR_CONTEXT_TOKENS

__all__ = [
    "ENGINE_INFO", "FRAME_COLUMNS", "KNOWN_GPUS", "SUMMARY_COLUMNS", "KnownGpu", "ModelShape",
    "Peaks", "RegimeResult", "RegimeSetup", "RooflineExcess", "chunk_bucket", "chunk_cost",
    "compute_regime", "regime_setup",
    "find_model_and_device", "find_peaks", "known_gpu", "regime", "regime_summary",
    "roofline_excess", "roofline_place",
]  # fmt: skip

FRAME_COLUMNS = (
    "trace_id", "condition", "chunk_tokens", "context_before", "dur_ns", "flops", "bytes",
    "intensity", "ridge", "bound", "attainable_flops_per_s", "achieved_flops_per_s",
    "roofline_fraction", "above_roofline",
)  # fmt: skip


def chunk_cost(
    shape: ModelShape, chunk_tokens: int | np.ndarray, context_before: int | np.ndarray
) -> tuple[Any, Any]:
    """``(flops, bytes)`` of one prefill chunk of ``chunk_tokens`` (T) after
    ``context_before`` (P) positions already in the K/V cache. Multiply-adds count 2.

    Integers give exact integers; arrays (one chunk per element) give float64 arrays,
    computed in float64 so that no product overflows int64.

    FLOPs: the projections and MLP ``2·layer_params·T`` per layer; causal attention
    (``QKᵀ`` and ``AV``) ``4·n_head·head_dim`` per kept (query, key) pair, of which there
    are ``T·P + T(T+1)/2``, per layer; the output head ``2·d_model·vocab`` once (the engine
    computes logits of the chunk's last position only). Norms, rotary, softmax and
    elementwise work are not counted (as ``benchmarks/prefill.py`` counts).

    Bytes, in the weights' dtype: every weight read once per forward (layers, norms,
    output head; the embedding only its ``T`` rows); K/V read for the ``P`` cached
    positions and written for the ``T`` new ones (``2·n_layer·n_kv_head·head_dim`` values
    per position); activations approximated as what an unfused implementation moves through
    its GEMMs and attention per token and layer — inputs ``5·d_model + 2·q_dim + d_ff``,
    outputs ``2·q_dim + 2·kv_dim + 2·d_model + 2·d_ff`` (norms, rotary, SiLU and residual
    adds taken as fused) — plus the head's input and logits. Caches are ignored: a kernel
    that keeps K/V or weights on chip moves fewer bytes.
    """
    if isinstance(chunk_tokens, np.ndarray) or isinstance(context_before, np.ndarray):
        t = np.asarray(chunk_tokens, dtype=np.float64)
        p = np.asarray(context_before, dtype=np.float64)
    else:
        t, p = int(chunk_tokens), int(context_before)
    s = shape
    d, q, kv = s.d_model, s.n_head * s.hd, s.n_kv_head * s.hd
    pairs = t * p + t * (t + 1) // 2
    flops = s.n_layer * (2 * s.layer_params * t + 4 * s.n_head * s.hd * pairs)
    flops += 2 * d * s.vocab
    weights = s.n_layer * (s.layer_params + 2 * d) + d + d * s.vocab
    kv_values = (p + t) * 2 * s.n_layer * kv
    per_token = s.n_layer * (7 * d + 4 * q + 2 * kv + 3 * s.d_ff) + d  # + embedding row
    activations = t * per_token + d + s.vocab
    return flops, s.dtype_bytes * (weights + kv_values + activations)


def regime(asm: Assembly, shape: ModelShape, peaks: Peaks | None) -> pd.DataFrame:
    """One row per valid ``prefill.chunk`` span of the assembly, in table order (columns
    `FRAME_COLUMNS`); rows the assembly counts as defects (a missing field, end before
    start) are left out.

    ``trace_id`` and ``condition`` are those of the chunk's request in ``asm.requests``
    (its smallest trace id; ``cold``/``prefix_hit``/None), so the chunks of traces joined
    by request id carry one request's values; None for a chunk of no request.
    ``context_before`` is ``context_tokens - chunk_tokens`` where the span has
    ``context_tokens``, else its ``cached_tokens`` (exact for a request's first chunk
    only), else 0. ``intensity`` is flops/bytes; ``bound`` is ``compute`` when
    it is at least the ridge (peak FLOP/s / peak bytes/s), else ``memory``;
    ``attainable_flops_per_s`` is ``min(peak, intensity·bandwidth)``;
    ``achieved_flops_per_s`` flops over the span's duration (clock-aligned times; NaN for
    a zero duration); ``above_roofline`` whether achieved exceeds attainable, which no
    device can (the peaks or the model config are wrong); ``roofline_fraction``
    achieved/attainable, NaN where ``above_roofline``. Without ``peaks`` the roofline
    columns are NaN, ``bound`` None and ``above_roofline`` False. A span without
    ``chunk_tokens`` is skipped.
    """
    spans = asm.rows
    rows = spans.of("prefill.chunk")
    if len(rows) == 0:
        return _frame({})
    attrs = spans.table.column("attributes")
    tokens = col.int_attribute(attrs, rows, ATTR_CHUNK_TOKENS)
    context = col.int_attribute(attrs, rows, ATTR_CONTEXT_TOKENS)
    cached = col.int_attribute(attrs, rows, ATTR_CACHED_TOKENS)
    keep = tokens >= 0
    rows, tokens, context, cached = rows[keep], tokens[keep], context[keep], cached[keep]
    before = np.where(context >= 0, np.maximum(context - tokens, 0), np.maximum(cached, 0))
    owner = spans.req[rows]
    flops, nbytes = chunk_cost(shape, tokens, before)
    frame = {
        **request_columns(asm, owner, "trace_id", "condition"),
        "chunk_tokens": tokens,
        "context_before": before,
        "dur_ns": spans.end_ns[rows] - spans.start_ns[rows],
        "flops": flops,
        "bytes": nbytes,
    }
    return _frame(frame, peaks)


def _frame(data: dict[str, Any], peaks: Peaks | None = None) -> pd.DataFrame:
    if not data:
        ints = ("chunk_tokens", "context_before", "dur_ns")
        dtypes = {c: ("int64" if c in ints else "float64") for c in FRAME_COLUMNS}
        dtypes.update(trace_id=object, condition=object, bound=object, above_roofline=bool)
        return pd.DataFrame({c: pd.Series(dtype=dtypes[c]) for c in FRAME_COLUMNS})
    df = pd.DataFrame(data)
    df["intensity"] = df["flops"] / df["bytes"]
    seconds = df["dur_ns"].to_numpy(dtype=np.float64) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        df["achieved_flops_per_s"] = np.where(seconds > 0, df["flops"] / seconds, np.nan)
    _roofline(df, peaks)
    df = df[list(FRAME_COLUMNS)]
    df.attrs["peaks"] = peaks
    return df


def _roofline(df: pd.DataFrame, peaks: Peaks | None) -> None:
    """Add ridge, bound, attainable, roofline_fraction and above_roofline from
    ``intensity`` and ``achieved_flops_per_s`` (in place)."""
    placed = roofline_place(
        peaks, df["intensity"].to_numpy(np.float64), df["achieved_flops_per_s"].to_numpy(np.float64)
    )
    df["ridge"] = peaks.ridge if peaks is not None else np.nan
    df["bound"] = pd.Series(placed["bound"], dtype=object, index=df.index)
    for name in ("attainable_flops_per_s", "roofline_fraction", "above_roofline"):
        df[name] = placed[name]


@dataclass
class RegimeResult:
    """A trace's regime (`compute_regime`): the per-chunk frame (None without a model
    shape, or where the chunks were summarized where they are kept, as a Dask driver
    does, and not gathered), its summary (None without a model shape) and how far the
    chunks went past the peaks (`roofline_excess`: None when none did or there is no
    roofline; found from ``frame`` when not given), the peaks (None without any) and the
    traced device's name."""

    frame: pd.DataFrame | None
    summary: pd.DataFrame | None
    peaks: Peaks | None
    device_name: str | None
    excess: RooflineExcess | None = None

    def __post_init__(self) -> None:
        if self.excess is None and self.frame is not None and self.peaks is not None:
            self.excess = roofline_excess(self.frame, self.peaks)

    @property
    def model_known(self) -> bool:
        """Whether the chunks were costed (the trace's model shape was known)."""
        return self.summary is not None


_CHUNK_ORDER = ["trace_id", "context_before", "chunk_tokens", "dur_ns"]


@dataclass(frozen=True)
class RegimeSetup:
    """What costing a trace's chunks needs, found once for the whole trace: the model's
    shape (None without one), the peaks (None without any) and the traced device's name."""

    shape: ModelShape | None
    peaks: Peaks | None
    device_name: str | None

    def result(self, frame: pd.DataFrame | None) -> RegimeResult:
        """The `RegimeResult` of ``frame``, every chunk's `regime` row (None without a
        model shape), sorted by request, then size, so that chunks that came in another
        order (a dataset's partitions) give the same frame; its figures never depend on
        the order (`roofline.regime_figures`)."""
        if frame is None:
            return RegimeResult(None, None, self.peaks, self.device_name)
        frame = frame.sort_values(_CHUNK_ORDER, kind="stable").reset_index(drop=True)
        frame.attrs["peaks"] = self.peaks
        return replace(self.result_of(InMemory([frame])), frame=frame)

    def result_of(self, parts: PartSet, chunks_of: Callable[[Any], pd.DataFrame | None]
                  = lambda p: p) -> RegimeResult:
        """The `RegimeResult` of the chunks of every part (``chunks_of(part)``: its
        `regime` rows), summarized where the parts are kept (a Dask driver's spilled
        parts, read back one at a time), without the per-chunk frame."""
        if self.shape is None:
            return RegimeResult(None, None, self.peaks, self.device_name)
        summary, excess = regime_figures(parts, self.peaks, chunks_of)
        return RegimeResult(None, summary, self.peaks, self.device_name, excess)


def regime_setup(
    table: pa.Table,
    metadata: dict[str, Any],
    *,
    model_config: dict[str, Any] | None = None,
    model_origin: str = "--model-config",
    peak_tflops: float | None = None,
    peak_bandwidth_gbs: float | None = None,
) -> RegimeSetup:
    """The model from ``model_config`` (the fields of a config file the user named,
    ``model_origin``) or the trace (its ``engine_info`` events in ``table``, else
    ``metadata``), the peaks from the trace (measured, else a known GPU's) or the given
    peaks; never from the machine running this.

    Raises:
        ValueError: the model config (given or the trace's) is not a model shape.
    """
    model, device = find_model_and_device(table, metadata)
    if model_config is not None:
        model = model_config
    shape = None
    if model is not None:
        try:
            shape = ModelShape.from_dict(model)
        except (ValueError, TypeError) as exc:
            where = model_origin if model_config is not None else "the trace's model config"
            raise ValueError(f"{where}: {exc}") from None
    flags = {}
    if peak_tflops is not None:
        flags["peak_flops_per_s"] = peak_tflops * 1e12
    if peak_bandwidth_gbs is not None:
        flags["peak_bytes_per_s"] = peak_bandwidth_gbs * 1e9
    peaks = find_peaks({"device": device} if device else {}, flags)
    return RegimeSetup(shape, peaks, (device or {}).get("name"))


def compute_regime(asm: Assembly, metadata: dict[str, Any], **options: Any) -> RegimeResult:
    """The regime of a trace's prefill chunks, set up (`regime_setup`, whose keyword
    arguments ``options`` are) from the trace ``asm`` assembled.

    Raises:
        ValueError: the model config (given or the trace's) is not a model shape.
    """
    setup = regime_setup(asm.rows.table, metadata, **options)
    return setup.result(None if setup.shape is None else regime(asm, setup.shape, setup.peaks))
