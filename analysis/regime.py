"""Prefill regime: per ``prefill.chunk``, FLOPs and bytes moved from the model's shape,
arithmetic intensity, and against the traced device's roofline whether the chunk was
compute- or memory-bound and what fraction of the attainable FLOP/s it achieved.

Where the model and the device come from (`find_model_and_device`), first found wins:

1. the run metadata: ``model_config`` (a ModelConfig's fields or a Hugging Face
   ``config.json``'s, with ``dtype``) and ``device``::

       {"name": "NVIDIA H200", "type": "cuda", "peak_flops_per_s": 7.1e14,
        "peak_bytes_per_s": 4.2e12, "peaks_source": "measured", "matmul_dtype": "bfloat16"}

   (``ttft profile-prefill`` writes both; ``ttft.engine.peaks.measure_peaks`` makes the
   device dict);
2. the engine's start-up point event ``engine_info`` (stage ``event``, in the engine's own
   trace), whose attributes are the same two dicts flattened: ``model.<field>`` and
   ``device.<key>``;
3. the engine's older run metadata ``engine`` (``model``, ``dtype``, ``device_name``).

Peaks (`find_peaks`): the device dict's measured ``peak_*`` values, else the `KNOWN_GPUS`
datasheet row matched by the device's name, else the caller's flags; never the machine
that runs the analysis. Pure: no I/O, no torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis import _columns as col
from ttft.analysis._conditions import conditions, max_cached
from ttft.analysis._gpus import KNOWN_GPUS, KnownGpu, known_gpu
from ttft.tracer.schema import ATTR_CACHED_TOKENS, ATTR_CHUNK_TOKENS, ATTR_CONTEXT_TOKENS

__all__ = [
    "ENGINE_INFO", "FRAME_COLUMNS", "KNOWN_GPUS", "SUMMARY_COLUMNS", "KnownGpu", "ModelShape",
    "Peaks", "chunk_bucket", "chunk_cost", "find_model_and_device", "find_peaks", "known_gpu",
    "regime", "regime_summary",
]  # fmt: skip

ENGINE_INFO = "engine_info"
"""Name of the engine's start-up point event carrying ``model.*`` and ``device.*``."""

FRAME_COLUMNS = (
    "trace_id", "condition", "chunk_tokens", "context_before", "dur_ns", "flops", "bytes",
    "intensity", "ridge", "bound", "attainable_flops_per_s", "achieved_flops_per_s",
    "roofline_fraction",
)  # fmt: skip

_DTYPE_BYTES = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "fp32": 4, "tf32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "int8": 1,
}  # fmt: skip


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of a Llama-style decoder (SwiGLU MLP, GQA).

    ``head_dim`` defaults to ``d_model // n_head``.
    """

    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    d_ff: int
    vocab: int
    dtype_bytes: int
    head_dim: int | None = None

    @property
    def hd(self) -> int:
        return self.head_dim or self.d_model // self.n_head

    @property
    def layer_params(self) -> int:
        """Weights of one layer's projections (wq, wk, wv, wo) and MLP (w1, w3, w2)."""
        d, q, kv = self.d_model, self.n_head * self.hd, self.n_kv_head * self.hd
        return 2 * d * q + 2 * d * kv + 3 * d * self.d_ff

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], dtype: str | None = None) -> ModelShape:
        """From a ttft ``ModelConfig`` dict (``n_layer``, ``d_model``, ``n_head``,
        ``n_kv_head``, ``d_ff``, ``vocab_size``) or a Hugging Face config
        (``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
        ``num_key_value_heads``, ``intermediate_size``, ``vocab_size``, ``head_dim``), with
        the weights' dtype from ``dtype``, else ``dtype_bytes``, ``dtype`` or ``torch_dtype``.

        Raises:
            ValueError: a missing field or an unknown dtype (names it).
        """

        def pick(*names: str, default: Any = None) -> Any:
            for name in names:
                if d.get(name) is not None:
                    return d[name]
            if default is None:
                raise ValueError(f"model config lacks {' / '.join(names)}")
            return default

        n_head = int(pick("n_head", "num_attention_heads"))
        dtype_bytes = d.get("dtype_bytes") if dtype is None else None
        if dtype_bytes is None:
            name = str(dtype or pick("dtype", "torch_dtype")).removeprefix("torch.").lower()
            if name not in _DTYPE_BYTES:
                raise ValueError(f"model config: unknown dtype {name!r}")
            dtype_bytes = _DTYPE_BYTES[name]
        head_dim = d.get("head_dim")
        return cls(
            n_layer=int(pick("n_layer", "num_hidden_layers")),
            d_model=int(pick("d_model", "hidden_size")),
            n_head=n_head,
            n_kv_head=int(pick("n_kv_head", "num_key_value_heads", default=n_head)),
            d_ff=int(pick("d_ff", "intermediate_size")),
            vocab=int(pick("vocab_size", "vocab")),
            dtype_bytes=int(dtype_bytes),
            head_dim=int(head_dim) if head_dim else None,
        )


@dataclass(frozen=True)
class Peaks:
    """A device's roofline: peak FLOP/s, memory bytes/s, its name and where they came from."""

    flops_per_s: float
    bytes_per_s: float
    device: str
    source: Literal["measured", "known-gpu", "flags"]

    @property
    def ridge(self) -> float:
        """FLOP per byte above which a kernel is compute-bound."""
        return self.flops_per_s / self.bytes_per_s


def _positive(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def find_peaks(
    metadata: Mapping[str, Any] | None, flags: Mapping[str, Any] | None = None
) -> Peaks | None:
    """The traced device's peaks, first found wins:

    1. ``metadata["device"]`` with positive ``peak_flops_per_s`` and ``peak_bytes_per_s``
       (measured on the traced machine) → source ``measured``;
    2. the device's name (``metadata["device"]["name"]``, else
       ``metadata["engine"]["device_name"]``) in `KNOWN_GPUS` → ``known-gpu``;
    3. ``flags`` with positive ``peak_flops_per_s`` and ``peak_bytes_per_s`` → ``flags``.

    None when none applies. Never measures anything.
    """
    metadata = metadata or {}
    device = metadata.get("device") if isinstance(metadata.get("device"), Mapping) else {}
    engine = metadata.get("engine") if isinstance(metadata.get("engine"), Mapping) else {}
    name = str(device.get("name") or engine.get("device_name") or "")
    flops, bw = _positive(device.get("peak_flops_per_s")), _positive(device.get("peak_bytes_per_s"))
    if flops and bw:
        return Peaks(flops, bw, name or "unknown device", "measured")
    gpu = known_gpu(name) if name else None
    if gpu is not None:
        return Peaks(gpu.flops_per_s, gpu.bytes_per_s, f"{name} (as {gpu.name})", "known-gpu")
    flags = flags or {}
    flops, bw = _positive(flags.get("peak_flops_per_s")), _positive(flags.get("peak_bytes_per_s"))
    if flops and bw:
        return Peaks(flops, bw, name or "unknown device", "flags")
    return None


def find_model_and_device(
    table: pa.Table | None, metadata: Mapping[str, Any] | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(model config dict, device dict)`` of a trace: the run metadata's
    ``model_config``/``device``, else the last ``engine_info`` event's ``model.*``/
    ``device.*`` attributes, else the traced server's model card (``server.models``, the
    ``ttft`` field of the reference server's ``/v1/models``), else the metadata's
    ``engine`` entry; None where not found.
    A model config from the ``engine`` entry carries its ``dtype``."""
    metadata = metadata or {}
    model = metadata.get("model_config")
    device = metadata.get("device")
    model = dict(model) if isinstance(model, Mapping) else None
    device = dict(device) if isinstance(device, Mapping) else None
    if (model is None or device is None) and table is not None and table.num_rows:
        event = _last_engine_info(table)
        if model is None and event.get("model"):
            model = event["model"]
        if device is None and event.get("device"):
            device = event["device"]
    for facts in _model_card_facts(metadata):  # ``ttft trace`` stores the server's model cards
        if model is None and isinstance(facts.get("model_config"), Mapping):
            model = dict(facts["model_config"])
        if device is None and isinstance(facts.get("device"), Mapping):
            device = dict(facts["device"])
    engine = metadata.get("engine")
    if isinstance(engine, Mapping):
        if model is None and isinstance(engine.get("model"), Mapping):
            model = {**engine["model"], "dtype": engine.get("dtype")}
        if device is None and engine.get("device_name"):
            device = {"name": engine["device_name"], "type": str(engine.get("device", ""))}
    return model, device


def _model_card_facts(metadata: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ``ttft`` objects of the traced server's ``/v1/models`` cards, the traced model's
    first, as ``ttft trace`` stores them under ``server``."""
    server = metadata.get("server")
    if not isinstance(server, Mapping):
        return []
    models = server.get("models")
    cards = models.get("data") if isinstance(models, Mapping) else None
    if not isinstance(cards, list):
        return []
    cards = [c for c in cards if isinstance(c, Mapping) and isinstance(c.get("ttft"), Mapping)]
    cards.sort(key=lambda c: c.get("id") != server.get("model"))
    return [c["ttft"] for c in cards]


def _last_engine_info(table: pa.Table) -> dict[str, dict[str, Any]]:
    rows = np.flatnonzero(pc.fill_null(pc.equal(table.column("name"), ENGINE_INFO), False))
    if len(rows) == 0:
        return {}
    attrs = json.loads(table.column("attributes")[int(rows[-1])].as_py() or "{}")
    out: dict[str, dict[str, Any]] = {}
    for key, value in attrs.items():
        group, _, field = key.partition(".")
        if group in ("model", "device") and field:
            out.setdefault(group, {})[field] = value
    return out


def chunk_cost(shape: ModelShape, chunk_tokens: int, context_before: int) -> tuple[int, int]:
    """``(flops, bytes)`` of one prefill chunk of ``chunk_tokens`` (T) after
    ``context_before`` (P) positions already in the K/V cache. Multiply-adds count 2.

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
    s, t, p = shape, int(chunk_tokens), int(context_before)
    d, q, kv = s.d_model, s.n_head * s.hd, s.n_kv_head * s.hd
    pairs = t * p + t * (t + 1) // 2
    flops = s.n_layer * (2 * s.layer_params * t + 4 * s.n_head * s.hd * pairs)
    flops += 2 * d * s.vocab
    weights = s.n_layer * (s.layer_params + 2 * d) + d + d * s.vocab
    kv_values = (p + t) * 2 * s.n_layer * kv
    per_token = s.n_layer * (7 * d + 4 * q + 2 * kv + 3 * s.d_ff) + d  # + embedding row
    activations = t * per_token + d + s.vocab
    return flops, s.dtype_bytes * (weights + kv_values + activations)


def regime(table: pa.Table, shape: ModelShape, peaks: Peaks | None) -> pd.DataFrame:
    """One row per ``prefill.chunk`` span, in table order (columns `FRAME_COLUMNS`).

    ``context_before`` is ``context_tokens - chunk_tokens`` where the span has
    ``context_tokens``, else its ``cached_tokens`` (exact for a request's first chunk
    only), else 0. ``condition`` is the request's (``cold``/``prefix_hit``/None, the rule
    of ``analysis.prefill``). ``intensity`` is flops/bytes; ``bound`` is ``compute`` when
    it is at least the ridge (peak FLOP/s / peak bytes/s), else ``memory``;
    ``attainable_flops_per_s`` is ``min(peak, intensity·bandwidth)``;
    ``achieved_flops_per_s`` flops over the span's duration (NaN for a zero duration);
    ``roofline_fraction`` achieved/attainable. Without ``peaks`` the roofline columns are
    NaN and ``bound`` None. A span without ``chunk_tokens`` is skipped.
    """
    if table.num_rows == 0:
        return _frame({})
    stage, stage_values = col.codes(table.column("stage"))
    if "prefill.chunk" not in stage_values:
        return _frame({})
    rows = np.flatnonzero(stage == stage_values.index("prefill.chunk"))
    attrs = table.column("attributes")
    tokens = col.int_attribute(attrs, rows, ATTR_CHUNK_TOKENS)
    context = col.int_attribute(attrs, rows, ATTR_CONTEXT_TOKENS)
    cached = col.int_attribute(attrs, rows, ATTR_CACHED_TOKENS)
    keep = tokens >= 0
    rows, tokens, context, cached = rows[keep], tokens[keep], context[keep], cached[keep]
    before = np.where(context >= 0, np.maximum(context - tokens, 0), np.maximum(cached, 0))

    trace, trace_values = col.codes(table.column("trace_id"))
    n = len(trace_values)
    with_trace = np.flatnonzero(trace >= 0)

    def rows_of(*names: str) -> np.ndarray:
        codes = [stage_values.index(s) for s in names if s in stage_values]
        return with_trace[np.isin(stage[with_trace], codes)]

    cond = conditions(
        max_cached(attrs, rows_of("server"), trace, n),
        max_cached(attrs, rows_of("prefill", "prefill.chunk"), trace, n),
    )
    owner = trace[rows]
    cost = [chunk_cost(shape, t, p) for t, p in zip(tokens.tolist(), before.tolist(), strict=True)]
    flops = np.array([c[0] for c in cost], dtype=np.float64)
    nbytes = np.array([c[1] for c in cost], dtype=np.float64)
    dur_ns = col.int64(table.column("end_ns"))[rows] - col.int64(table.column("start_ns"))[rows]
    frame = {
        "trace_id": pd.Series([trace_values[o] if o >= 0 else None for o in owner], dtype=object),
        "condition": pd.Series([cond[o] if o >= 0 else None for o in owner], dtype=object),
        "chunk_tokens": tokens,
        "context_before": before,
        "dur_ns": dur_ns,
        "flops": flops,
        "bytes": nbytes,
    }
    return _frame(frame, peaks)


def _frame(data: dict[str, Any], peaks: Peaks | None = None) -> pd.DataFrame:
    if not data:
        ints = ("chunk_tokens", "context_before", "dur_ns")
        dtypes = {c: ("int64" if c in ints else "float64") for c in FRAME_COLUMNS}
        dtypes.update(trace_id=object, condition=object, bound=object)
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
    """Add ridge, bound, attainable and roofline_fraction from ``intensity`` and
    ``achieved_flops_per_s`` (in place)."""
    if peaks is None:
        df["ridge"] = np.nan
        df["bound"] = pd.Series([None] * len(df), dtype=object, index=df.index)
        df["attainable_flops_per_s"] = np.nan
        df["roofline_fraction"] = np.nan
        return
    intensity = df["intensity"].to_numpy(dtype=np.float64)
    df["ridge"] = peaks.ridge
    df["bound"] = np.where(intensity >= peaks.ridge, "compute", "memory").astype(object)
    attainable = np.minimum(peaks.flops_per_s, intensity * peaks.bytes_per_s)
    df["attainable_flops_per_s"] = attainable
    df["roofline_fraction"] = df["achieved_flops_per_s"].to_numpy(dtype=np.float64) / attainable


SUMMARY_COLUMNS = (
    "condition", "chunk_bucket", "chunks", "tokens", "median_intensity", "ridge", "bound",
    "compute_bound_share", "achieved_flops_per_s", "attainable_flops_per_s",
    "roofline_fraction",
)  # fmt: skip


def chunk_bucket(chunk_tokens: int) -> str:
    """Power-of-two bucket of a chunk size: ``"1"``, ``"2-3"``, …, ``"256-511"``."""
    if chunk_tokens <= 1:
        return "1"
    lo = 1 << (int(chunk_tokens).bit_length() - 1)
    return f"{lo}-{2 * lo - 1}"


def regime_summary(frame: pd.DataFrame, peaks: Peaks | None = None) -> pd.DataFrame:
    """Per condition (``cold``, ``prefix_hit``, then ``all``, which mixes both and chunks
    of unknown condition) and chunk bucket (`chunk_bucket`, ascending, then ``all``):
    chunks, tokens, the median chunk intensity, the ridge, ``bound`` and the achieved,
    attainable and fraction figures of the group as a whole (its FLOPs over its bytes and
    over its summed duration), and ``compute_bound_share`` (of its chunks). ``peaks``
    defaults to those `regime` used (``frame.attrs["peaks"]``); without any, the roofline
    columns are NaN and ``bound`` None.
    """
    if frame.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in SUMMARY_COLUMNS})
    peaks = peaks if peaks is not None else frame.attrs.get("peaks")
    ridge = peaks.ridge if peaks is not None else math.nan
    buckets = frame["chunk_tokens"].map(chunk_bucket)
    order = sorted(set(buckets), key=lambda b: int(b.split("-")[0]))
    groups: list[tuple[str, str, pd.Series]] = []
    cond = frame["condition"]
    for name in ("cold", "prefix_hit", "all"):
        in_cond = pd.Series(True, index=frame.index) if name == "all" else cond == name
        if not in_cond.any():
            continue
        for bucket in [*order, "all"]:
            mask = in_cond & (buckets == bucket) if bucket != "all" else in_cond
            if mask.any():
                groups.append((name, bucket, mask))
    out = []
    for name, bucket, mask in groups:
        g = frame[mask]
        flops, nbytes = float(g["flops"].sum()), float(g["bytes"].sum())
        seconds = float(g["dur_ns"].clip(lower=0).sum()) / 1e9
        achieved = flops / seconds if seconds > 0 else math.nan
        intensity = flops / nbytes
        attainable = math.nan
        bound = None
        if peaks is not None:
            attainable = min(peaks.flops_per_s, intensity * peaks.bytes_per_s)
            bound = "compute" if intensity >= ridge else "memory"
        out.append(
            {
                "condition": name,
                "chunk_bucket": bucket,
                "chunks": len(g),
                "tokens": int(g["chunk_tokens"].sum()),
                "median_intensity": float(g["intensity"].median()),
                "ridge": ridge,
                "bound": bound,
                "compute_bound_share": float((g["bound"] == "compute").mean()),
                "achieved_flops_per_s": achieved,
                "attainable_flops_per_s": attainable,
                "roofline_fraction": achieved / attainable if attainable > 0 else math.nan,
            }
        )
    return pd.DataFrame(out, columns=list(SUMMARY_COLUMNS))
