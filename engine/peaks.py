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
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ttft.tracer import clock_ns, record, stats

__all__ = [
    "SKIP_ENV",
    "best_peaks",
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
_SIZES = 3  # matmul sizes measured in every slice: the largest that fits and two below
_SLICES = 6  # of the budget, each half matmuls, half copies


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

    A peak measured once, at a moment the machine is busy, understates the device (a
    350 MFLOP/s "peak" under which prefill then ran at 20 GFLOP/s). So the figures are the
    best of many short runs spread over the whole budget: square ``n×n @ n×n`` matmuls
    (bfloat16 on CUDA, the engine's dtype there; float32 on the CPU) at up to three sizes,
    ``n`` doubling from a small size while the next size's run (best of 3) still fits a
    sixteenth of the budget (``2·n³`` FLOPs each), and a ``dst.copy_(src)`` of a buffer
    larger than the caches (64 MiB on the CPU, up to 1 GiB on CUDA, less when memory is
    short; bytes read plus written). The budget is cut in six slices, each spending half
    on matmuls (every size in turn) and half on copies, after one untimed warm-up run of
    each. On CUDA each run is timed with CUDA events and waited for (device time); on the
    CPU with ``perf_counter``. Every slice runs each at least once, so a very busy machine
    can overrun the budget by a few runs.

    Returns:
        The device dict of a trace (``ttft.analysis.regime``): ``name``, ``type``,
        ``peak_flops_per_s``, ``peak_bytes_per_s`` (the best runs), ``peaks_source``
        (``measured``), ``matmul_dtype``, ``matmul_n`` (the size of the best matmul),
        ``matmul_sizes``, ``copy_bytes``, ``rounds`` (slices measured),
        ``median_flops_per_s`` and ``median_bytes_per_s`` (the median over slices of each
        slice's best: far below the peaks, the machine was busy while measuring),
        ``measure_ns`` (wall time spent), ``torch`` and, on the CPU, ``threads`` (torch's)
        and ``matmul_threads`` (of the best matmul: every other slice runs one thread).

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


def _matmuls(dev: torch.device, dtype: torch.dtype, timer: _Timer, budget_s: float
             ) -> list[tuple[int, Callable[[], object]]]:  # fmt: skip
    """``(n, matmul)`` of up to `_SIZES` square sizes, the largest whose run (timed once,
    after a warm-up) lets the next, 8× longer, still fit ``budget_s / 16`` and two below."""
    n, n_max = _MATMUL_N[dev.type]
    found: list[tuple[int, Callable[[], object]]] = []
    give_up = time.perf_counter() + budget_s / 4
    while True:
        matmul = functools.partial(
            torch.matmul,
            torch.randn(n, n, device=dev, dtype=dtype),
            torch.randn(n, n, device=dev, dtype=dtype),
        )
        timer(matmul)  # warm-up (library init, page faults)
        found = [*found[-(_SIZES - 1) :], (n, matmul)]
        seconds = min(timer(matmul) for _ in range(3))  # best of 3: load makes any one slow
        if n >= n_max or seconds * 8 > budget_s / 16 or time.perf_counter() > give_up:
            return found
        n *= 2


def _set_threads(dev: torch.device, threads: int) -> None:
    """torch's intra-op threads on the CPU (process-wide; the engine has not started)."""
    if dev.type == "cpu" and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _measure(dev: torch.device, budget_s: float) -> dict[str, Any]:
    t0_ns = time.perf_counter_ns()
    deadline = time.perf_counter() + budget_s
    timer = _Timer(dev)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    matmuls = _matmuls(dev, dtype, timer, budget_s)

    nbytes = _COPY_BYTES[dev.type]
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        nbytes = min(nbytes, free // 8)
    numel = max(nbytes // 4, 1 << 16)
    src = torch.ones(numel, device=dev, dtype=torch.float32)
    copy = functools.partial(torch.empty_like(src).copy_, src)
    copy_bytes = src.numel() * src.element_size()
    timer(copy)  # warm-up: touches the destination's pages

    # Slices interleave the two figures over the whole budget, and many short runs per
    # slice catch the moments the machine is free: a burst of load spoils a slice, not a
    # figure.
    flops_rounds: list[tuple[float, int]] = []  # (best FLOP/s of a slice, its n)
    bytes_rounds: list[float] = []
    slice_s = budget_s / _SLICES
    threads = torch.get_num_threads() if dev.type == "cpu" else 1
    best_threads = threads
    try:
        while not flops_rounds or time.perf_counter() < deadline:
            # On a busy CPU a parallel matmul waits for its slowest thread to be scheduled
            # (40 ms stalls, 0.1 GFLOP/s): every other slice's matmuls run on one thread,
            # a rate the device reaches as surely.
            slice_threads = 1 if len(flops_rounds) % 2 else threads
            _set_threads(dev, slice_threads)
            best, stop = (0.0, 0), time.perf_counter() + slice_s / 2
            while best == (0.0, 0) or time.perf_counter() < stop:
                best = max(best, *((2 * n**3 / max(timer(mm), 1e-9), n) for n, mm in matmuls))
            if not flops_rounds or best > max(flops_rounds):
                best_threads = slice_threads
            flops_rounds.append(best)
            _set_threads(dev, threads)
            best_bytes, stop = 0.0, time.perf_counter() + slice_s / 2
            while best_bytes == 0 or time.perf_counter() < stop:
                best_bytes = max(best_bytes, 2 * copy_bytes / max(timer(copy), 1e-9))
            bytes_rounds.append(best_bytes)
    finally:
        _set_threads(dev, threads)
    sizes = [n for n, _ in matmuls]
    del matmuls, src, copy

    best_flops, best_n = max(flops_rounds)
    out: dict[str, Any] = {
        "name": device_name(dev),
        "type": dev.type,
        "peak_flops_per_s": float(best_flops),
        "peak_bytes_per_s": float(max(bytes_rounds)),
        "peaks_source": "measured",
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "matmul_n": best_n,
        "matmul_sizes": sizes,
        "copy_bytes": copy_bytes,
        "rounds": len(flops_rounds),
        "median_flops_per_s": float(statistics.median(f for f, _ in flops_rounds)),
        "median_bytes_per_s": float(statistics.median(bytes_rounds)),
        "measure_ns": time.perf_counter_ns() - t0_ns,
        "torch": torch.__version__,
    }
    if dev.type == "cuda":
        out["index"] = dev.index
    else:
        out["threads"] = threads
        out["matmul_threads"] = best_threads
    if not all(math.isfinite(out[k]) for k in ("peak_flops_per_s", "peak_bytes_per_s")):
        raise RuntimeError(f"peak measurement on {dev} gave non-finite figures: {out}")
    return out


def best_peaks(*measured: dict[str, Any]) -> dict[str, Any]:
    """Several `measure_peaks` results of one device as one: the best ``peak_*`` (with the
    ``matmul_n`` of the best matmul), ``rounds`` and ``measure_ns`` summed, the medians of
    the measurement with the most rounds; the rest as the first has it.

    Raises:
        ValueError: no measurement, or measurements of different devices.
    """
    if not measured:
        raise ValueError("best_peaks needs at least one measurement")
    if len({(m.get("type"), m.get("name"), m.get("index")) for m in measured}) > 1:
        raise ValueError("best_peaks: the measurements are of different devices")
    fastest = max(measured, key=lambda m: m["peak_flops_per_s"])
    longest = max(measured, key=lambda m: m.get("rounds", 1))
    return {
        **measured[0],
        "peak_flops_per_s": fastest["peak_flops_per_s"],
        "matmul_n": fastest.get("matmul_n"),
        "peak_bytes_per_s": max(m["peak_bytes_per_s"] for m in measured),
        "rounds": sum(m.get("rounds", 1) for m in measured),
        "median_flops_per_s": longest.get("median_flops_per_s"),
        "median_bytes_per_s": longest.get("median_bytes_per_s"),
        "measure_ns": sum(m.get("measure_ns", 0) for m in measured),
    }


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
