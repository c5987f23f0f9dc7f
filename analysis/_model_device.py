"""What the roofline of `analysis.regime` needs and where a trace says it: the model's shape
(`ModelShape`), the device's peaks (`Peaks`, `find_peaks`) and the lookup of both
(`find_model_and_device`). Re-exported by ``analysis.regime``, their public home.

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
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis._gpus import known_gpu

ENGINE_INFO = "engine_info"
"""Name of the engine's start-up point event carrying ``model.*`` and ``device.*``."""

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
