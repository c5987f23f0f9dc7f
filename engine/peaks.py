"""The traced device's peaks, measured where the engine runs: a matmul's FLOP/s and a
copy's memory bandwidth, within a small time budget.

``ttft.analysis.regime`` places each prefill chunk on the device's roofline; these figures
travel in the trace (the engine's ``engine_info`` start-up event, the run metadata of
``ttft profile-prefill``) so that analysis never uses the machine that merely reads the
trace. They are what this process can reach with torch, not datasheet peaks: a lower
bound of the hardware's, and the fair reference for the engine's own kernels.

``TTFT_SKIP_PEAKS=1`` in the environment turns the measurement off everywhere.

Also what a trace says about the engine beside them: its run metadata
(``engine_metadata``) and its ``engine_info`` event (``record_engine_info``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import torch

from ttft.tracer import clock_ns, record, stats

__all__ = [
    "SKIP_ENV",
    "cached_peaks",
    "device_name",
    "engine_metadata",
    "measure_peaks",
    "record_engine_info",
]

log = logging.getLogger(__name__)
SKIP_ENV = "TTFT_SKIP_PEAKS"
ENGINE_INFO = "engine_info"  # the event ``ttft.analysis.regime.find_model_and_device`` reads
_COPY_BYTES = {"cpu": 64 << 20, "cuda": 1 << 30}  # per buffer; beyond the caches
_MATMUL_N = {"cpu": (128, 2048), "cuda": (1024, 8192)}  # (first, largest) square size


def skipped() -> bool:
    """Whether ``TTFT_SKIP_PEAKS`` asks not to measure."""
    return os.environ.get(SKIP_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def device_name(device: str | torch.device) -> str:
    """The device's marketing name (``NVIDIA H200``) or, on the CPU, the processor's."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


class _Timer:
    """Seconds of one call: CUDA events around it and a synchronize on the end event
    (device time), or ``perf_counter`` on the CPU."""

    def __init__(self, dev: torch.device) -> None:
        self.cuda = dev.type == "cuda"

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


@torch.inference_mode()
def measure_peaks(device: str | torch.device = "cpu", budget_s: float = 0.3) -> dict[str, Any]:
    """Measure the device's matmul FLOP/s and copy bandwidth in about ``budget_s``.

    Matmul: square ``n×n @ n×n`` in bfloat16 on CUDA (the engine's dtype there), float32
    on the CPU; ``n`` doubles from a small size while the next size still fits a quarter
    of half the budget, then the best of repeated runs until half the budget is spent
    (``2·n³`` FLOPs each). Copy: ``dst.copy_(src)`` of a buffer larger than the caches
    (64 MiB on the CPU, up to 1 GiB on CUDA, less when memory or the budget is short),
    best of repeats, counting bytes read plus written. On CUDA each run is timed with CUDA
    events and waited for (device time); on the CPU with ``perf_counter``.

    Returns:
        The device dict of a trace (``ttft.analysis.regime``): ``name``, ``type``,
        ``peak_flops_per_s``, ``peak_bytes_per_s``, ``peaks_source`` (``measured``),
        ``matmul_dtype``, ``matmul_n``, ``copy_bytes``, ``measure_ns`` (wall time spent),
        ``torch`` and, on the CPU, ``threads``.

    Raises:
        ValueError: a device type other than ``cpu`` or ``cuda``, or a non-positive budget.
    """
    dev = torch.device(device)
    if dev.type not in _MATMUL_N:
        raise ValueError(f"can measure peaks on cpu or cuda, not {dev.type!r}")
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s}")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    # CUDA events record on the current device's stream: make it the measured device's.
    with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
        return _measure(dev, budget_s)


def _measure(dev: torch.device, budget_s: float) -> dict[str, Any]:
    t0_ns = time.perf_counter_ns()
    timer = _Timer(dev)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    half_s = budget_s / 2

    # -- matmul --------------------------------------------------------------------------
    n, n_max = _MATMUL_N[dev.type]
    deadline = time.perf_counter() + half_s
    while True:
        matmul = functools.partial(
            torch.matmul,
            torch.randn(n, n, device=dev, dtype=dtype),
            torch.randn(n, n, device=dev, dtype=dtype),
        )
        timer(matmul)  # warm-up (library init, page faults)
        seconds = timer(matmul)
        if n >= n_max or seconds * 8 > half_s / 4 or time.perf_counter() > deadline:
            break
        n *= 2
    best_flops = 2 * n**3 / max(seconds, 1e-9)
    while time.perf_counter() < deadline:
        best_flops = max(best_flops, 2 * n**3 / max(timer(matmul), 1e-9))
    del matmul  # frees the operands before the copy buffers are allocated

    # -- copy ----------------------------------------------------------------------------
    nbytes = _COPY_BYTES[dev.type]
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        nbytes = min(nbytes, free // 8)
    numel = max(nbytes // 4, 1 << 16)
    src = torch.ones(numel, device=dev, dtype=torch.float32)
    copy = functools.partial(torch.empty_like(src).copy_, src)
    copy_bytes = src.numel() * src.element_size()
    deadline = time.perf_counter() + half_s
    timer(copy)  # warm-up: touches the destination's pages
    best_s = timer(copy)
    while time.perf_counter() < deadline:
        best_s = min(best_s, timer(copy))
    del src, copy

    out: dict[str, Any] = {
        "name": device_name(dev),
        "type": dev.type,
        "peak_flops_per_s": float(best_flops),
        "peak_bytes_per_s": float(2 * copy_bytes / max(best_s, 1e-9)),
        "peaks_source": "measured",
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "matmul_n": n,
        "copy_bytes": copy_bytes,
        "measure_ns": time.perf_counter_ns() - t0_ns,
        "torch": torch.__version__,
    }
    if dev.type == "cuda":
        out["index"] = dev.index
    else:
        out["threads"] = torch.get_num_threads()
    if not all(math.isfinite(out[k]) for k in ("peak_flops_per_s", "peak_bytes_per_s")):
        raise RuntimeError(f"peak measurement on {dev} gave non-finite figures: {out}")
    return out


@functools.cache
def _cached(device: str, budget_s: float) -> tuple[tuple[str, Any], ...]:
    return tuple(measure_peaks(device, budget_s).items())


def cached_peaks(device: str | torch.device, budget_s: float = 0.3) -> dict[str, Any]:
    """`measure_peaks`, once per process and device (engines started again reuse it)."""
    return dict(_cached(str(torch.device(device)), budget_s))


def engine_metadata(model: torch.nn.Module, config: object) -> dict[str, Any]:
    """What a trace file records about an engine (its run metadata's ``engine``): the
    model's ``device`` and ``device_name`` (``cpu`` on the CPU), ``dtype``, the model's
    configuration (``model``), the engine's (``config``, a dataclass), torch's version and
    thread count."""
    param = next(model.parameters())
    dev = param.device
    return {
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "dtype": str(param.dtype).removeprefix("torch."),
        "model": dataclasses.asdict(model.config),
        "config": dataclasses.asdict(config),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def record_engine_info(model: torch.nn.Module, measure: bool | None = None) -> dict[str, Any]:
    """Record the ``engine_info`` point event (stage ``event``) in a trace of its own: the
    model config as ``model.<field>`` (with ``model.dtype``) and the device as
    ``device.<key>`` attributes, peaks included when measured.

    Args:
        model: the engine's ``Transformer`` (its ``config`` and first parameter are read).
        measure: measure the peaks (`cached_peaks`); None measures only when tracing is
            configured. ``TTFT_SKIP_PEAKS`` turns it off either way.

    Returns:
        The device dict (``name`` and ``type``, plus `measure_peaks`' keys when measured;
        a failed measurement is logged and leaves them out). Recording is a no-op when
        tracing is not configured.
    """
    param = next(model.parameters())
    dev = param.device
    traced = stats() is not None
    if measure is None:
        measure = traced
    device = {"name": device_name(dev), "type": dev.type}
    if measure and not skipped():
        try:
            device = cached_peaks(dev)
        except Exception:  # a failed measurement must not keep the engine from starting
            log.warning("ttft engine: measuring the device's peaks failed", exc_info=True)
    if traced:
        attrs = {f"model.{k}": v for k, v in dataclasses.asdict(model.config).items()}
        attrs["model.dtype"] = str(param.dtype).removeprefix("torch.")
        attrs.update({f"device.{k}": v for k, v in device.items()})
        now_ns = clock_ns()
        # An empty context: no caller's span or request can adopt the event.
        contextvars.Context().run(record, ENGINE_INFO, now_ns, now_ns, stage_name="event", **attrs)
    return device
