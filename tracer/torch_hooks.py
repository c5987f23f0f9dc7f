"""Torch module hooks: a host span per forward pass and, on CUDA, its device time.

What each span measures (STYLE.md rule 6):

- ``forward`` (``timing="host"``): pre-hook to forward hook, on the calling thread and the
  host clock. On CUDA this is host *enqueue* time: its kernels may still be running after.
  ``forward.<child>`` spans (stage ``other``, ``per_layer=True``) are the same per child.
- ``gpu`` (``timing="device"``, clock ``gpu:<index>``): device time between two CUDA events
  recorded on the current stream around the forward, a child of its forward span, mapped
  to the host clock through an anchor event (DESIGN.md, "Clocks"). Without CUDA the
  forward span says ``gpu="none"`` and no ``gpu`` span follows.

Threading: hooks run on the thread that calls the module. Each hooked module keeps a
per-thread stack of open spans, so recursion and calls from several threads nest
correctly. CUDA events are resolved off the hot path by :class:`GpuResolver`'s daemon
thread, which only calls ``query()`` on them (and waits on its own fresh anchor event every
10 s); the traced thread never synchronizes, except once for a device without an anchor.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ttft.tracer import api
from ttft.tracer.context import SpanRef
from ttft.tracer.schema import ATTR_STEP_ID

__all__ = ["Anchor", "CudaEvents", "GpuResolver", "Instrumentation", "instrument_module"]

logger = logging.getLogger(__name__)
_GPU_KEYS = ("module", "tokens", ATTR_STEP_ID)  # forward attributes a gpu span repeats


class CudaEvents:
    """Where a :class:`GpuResolver` gets its events: CUDA timing events on the current
    stream of the tensor's device. A test's fake has the same methods, and events with
    ``query()``, ``elapsed_time(end)`` (ms) and ``synchronize()``."""

    def device_of(self, tensor: torch.Tensor) -> int | None:
        """The CUDA device of ``tensor``; None off CUDA or while a CUDA graph is captured."""
        if tensor.is_cuda and not torch.cuda.is_current_stream_capturing():
            return tensor.device.index
        return None

    def new_event(self, device: int) -> Any:
        return torch.cuda.Event(enable_timing=True)

    def record(self, event: Any, device: int) -> None:
        event.record(torch.cuda.current_stream(device))


@dataclass(frozen=True)
class Anchor:
    """A device event whose completion was seen on the host at ``host_ns`` (epoch ns, read
    right after ``event.synchronize()``): a later event of the device maps to the host
    clock as ``host_ns + event.elapsed_time(later) * 1e6``."""

    event: Any
    host_ns: int

    def host_ns_of(self, event: Any) -> int:
        return self.host_ns + round(self.event.elapsed_time(event) * 1e6)


@dataclass(eq=False)
class _Pending:
    device: int
    anchor: Anchor
    launch_ns: int  # host epoch ns just before the start event was enqueued
    start: Any
    end: Any = None
    parent: SpanRef | None = None
    attributes: dict[str, Any] | None = None


class GpuResolver:
    """Turns start/end event pairs into ``gpu`` spans once the device has passed them.

    Args:
        events: the event source (default :class:`CudaEvents`).
        clock: host epoch ns (default ``ttft.tracer.clock_ns``).
        reanchor_interval_s: how often the resolver thread takes a fresh anchor per device,
            bounding the drift between host and device clocks.
        poll_interval_s: how often the resolver thread polls while pairs are pending.
        thread: run the resolver thread; without it, call :meth:`poll` yourself.

    Threading: :meth:`launch` and :meth:`finish` run on the traced thread and never block,
    except :meth:`launch` on a device without an anchor (one ``synchronize``, once);
    :meth:`poll` only calls ``query()``. Failures are counted in ``failed``, never raised.
    A ``gpu`` span never starts before the host enqueued its start event (``clamped_ns``
    says by how much the anchor mapping was off).
    """

    def __init__(
        self,
        events: Any = None,
        *,
        clock: Callable[[], int] = api.clock_ns,
        reanchor_interval_s: float = 10.0,
        poll_interval_s: float = 0.002,
        thread: bool = True,
    ) -> None:
        self.events = events if events is not None else CudaEvents()
        self.reanchor_interval_s = reanchor_interval_s
        self.poll_interval_s = poll_interval_s
        self.resolved = 0
        self.failed = 0
        self._clock = clock
        self._anchors: dict[int, Anchor] = {}
        self._submitted: deque[_Pending] = deque()  # traced threads append, poll() pops
        self._waiting: list[_Pending] = []  # only touched under _poll_lock
        self._poll_lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = False
        self._closed = False
        self._thread: threading.Thread | None = None
        if thread:
            self._thread = threading.Thread(target=self._run, name="ttft-gpu", daemon=True)
            self._thread.start()

    @property
    def pending(self) -> int:  # pairs submitted and not yet resolved
        return len(self._submitted) + len(self._waiting)

    def anchor(self, device: int) -> Anchor:
        """Record an anchor event on ``device``, wait for it (blocks the calling thread) and
        read the host clock right after; later launches on the device map through it."""
        event = self.events.new_event(device)
        self.events.record(event, device)
        event.synchronize()
        anchor = self._anchors[device] = Anchor(event, self._clock())
        return anchor

    def ensure_anchor(self, device: int) -> Anchor:
        """The device's current anchor, taken now if it has none."""
        return self._anchors.get(device) or self.anchor(device)

    def launch(self, device: int) -> _Pending:
        """Enqueue the start event of one forward on ``device`` (traced thread)."""
        anchor = self.ensure_anchor(device)
        start = self.events.new_event(device)
        launch_ns = self._clock()
        self.events.record(start, device)
        return _Pending(device, anchor, launch_ns, start)

    def finish(self, pending: _Pending, parent: SpanRef, attributes: dict[str, Any]) -> None:
        """Enqueue the end event and hand the pair to the resolver (traced thread)."""
        pending.end = self.events.new_event(pending.device)
        self.events.record(pending.end, pending.device)
        pending.parent = parent
        pending.attributes = attributes
        self._submitted.append(pending)
        if self._idle:
            self._wake.set()

    def poll(self) -> int:
        """Emit a ``gpu`` span for every pair whose end event the device has passed (events
        of a stream complete in order, so its start has too); returns how many."""
        with self._poll_lock:
            while self._submitted:
                self._waiting.append(self._submitted.popleft())
            still: list[_Pending] = []
            done = 0
            for pending in self._waiting:
                try:
                    if not pending.end.query():
                        still.append(pending)
                        continue
                    self._emit(pending)
                    done += 1
                except Exception:
                    self.failed += 1
                    logger.debug("ttft gpu resolver: resolving events failed", exc_info=True)
            self._waiting = still
            self.resolved += done
            return done

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the thread, then poll (sleeping between polls, never synchronizing) until
        nothing is pending or ``timeout_s`` passed; pairs left are counted in ``failed``."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            if not self.pending or time.monotonic() >= deadline:
                break
            time.sleep(self.poll_interval_s)
        with self._poll_lock:
            self.failed += self.pending
            self._submitted.clear()
            self._waiting.clear()
        if self.failed:
            logger.warning("ttft gpu resolver: %d gpu spans lost", self.failed)

    def _emit(self, pending: _Pending) -> None:
        device_start_ns = pending.anchor.host_ns_of(pending.start)
        start_ns = max(device_start_ns, pending.launch_ns)
        end_ns = max(pending.anchor.host_ns_of(pending.end), start_ns)
        attributes = pending.attributes or {}
        if start_ns > device_start_ns:  # anchor error: the device cannot start before enqueue
            attributes["clamped_ns"] = start_ns - device_start_ns
        api.record(
            "gpu",
            start_ns,
            end_ns,
            parent=pending.parent,
            clock=f"gpu:{pending.device}",
            timing="device",
            **attributes,
        )

    def _run(self) -> None:
        next_anchor_s = time.monotonic() + self.reanchor_interval_s
        while not self._closed:
            self._idle = True  # set before reading pending, so a later finish() wakes us
            wait_s = self.poll_interval_s if self.pending else next_anchor_s - time.monotonic()
            self._wake.wait(max(0.0, wait_s))
            self._idle = False
            self._wake.clear()
            self.poll()
            if time.monotonic() >= next_anchor_s and not self._closed:
                for device in list(self._anchors):
                    try:
                        self.anchor(device)
                    except Exception:
                        self.failed += 1
                        logger.debug("ttft gpu resolver: re-anchoring failed", exc_info=True)
                next_anchor_s = time.monotonic() + self.reanchor_interval_s


def _tokens(x: Any) -> int | None:
    """Positions in a module input: the last dim of integer token ids ``(B, T)``, the
    second to last of float activations ``(B, T, D)``."""
    if not isinstance(x, torch.Tensor):
        return None
    shape = x.shape
    if x.is_floating_point():
        return shape[-2] if len(shape) >= 2 else None
    return shape[-1] if shape else None


def _layers(module: torch.nn.Module, prefix: str = "") -> Iterator[tuple[str, torch.nn.Module]]:
    """Direct children; a ``ModuleList``/``ModuleDict`` (never called itself) stands for its
    own children, ``blocks.0``, ``blocks.1``, …"""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.ModuleList | torch.nn.ModuleDict):
            yield from _layers(child, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", child


class Instrumentation:
    """The hooks :func:`instrument_module` installed; ``remove()`` them or leave the
    ``with`` block (which also closes a GPU resolver it started).

    Attributes:
        resolver: the :class:`GpuResolver` of ``gpu`` spans, or None.
        failed: hot-path failures of the GPU timing (counted, never raised).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        stage: str,
        per_layer: bool,
        resolver: GpuResolver | None,
        owns_resolver: bool,
        no_gpu: str,
    ) -> None:
        self.module = module
        self.resolver = resolver
        self.failed = 0
        self._owns_resolver = owns_resolver
        self._handles: list[Any] = []
        if resolver is not None:  # anchor now, not on the first forward
            for tensor in (*module.parameters(), *module.buffers()):
                device = resolver.events.device_of(tensor)
                if device is not None:
                    resolver.ensure_anchor(device)
        self._hook(module, stage, None, None, resolver, no_gpu)
        if per_layer:
            for name, child in _layers(module):
                self._hook(child, f"{stage}.{name}", "other", name, None, None)

    def _hook(
        self,
        module: torch.nn.Module,
        name: str,
        stage_name: str | None,
        layer: str | None,
        resolver: GpuResolver | None,
        no_gpu: str | None,
    ) -> None:
        local = threading.local()  # .stack: this module's open spans on this thread
        cls = type(module).__name__

        def pre(mod: torch.nn.Module, args: tuple[Any, ...], kwargs: Any) -> None:
            stack = local.__dict__.setdefault("stack", [])
            x = args[0] if args else None
            span = api.stage(name, module=cls, timing="host")
            span.stage_name = stage_name
            attributes = span.attributes
            if (tokens := _tokens(x)) is not None:
                attributes["tokens"] = tokens
            if layer is not None:
                attributes["layer"] = layer
            outer = api.current_span()
            if outer is not None and outer.attributes and ATTR_STEP_ID in outer.attributes:
                attributes[ATTR_STEP_ID] = outer.attributes[ATTR_STEP_ID]
            span.__enter__()
            pending = None
            if resolver is not None and isinstance(x, torch.Tensor):
                try:
                    device = resolver.events.device_of(x)
                    if device is not None:
                        pending = resolver.launch(device)
                        attributes["gpu"] = f"gpu:{device}"
                except Exception:
                    self.failed += 1
            if pending is None and no_gpu is not None:
                attributes["gpu"] = no_gpu
            stack.append((span, sys.exc_info()[1], pending))

        def post(mod: torch.nn.Module, args: Any, kwargs: Any, result: Any) -> None:
            stack = getattr(local, "stack", None)
            if not stack:  # our pre-hook did not run (a hook before it raised)
                return
            span, exc_before, pending = stack.pop()
            if pending is not None and resolver is not None:
                try:
                    keep = {k: span.attributes[k] for k in _GPU_KEYS if k in span.attributes}
                    resolver.finish(pending, span, keep)
                except Exception:
                    self.failed += 1
            exc = sys.exc_info()  # torch calls always_call hooks inside its ``except``
            if exc[1] is not None and exc[1] is not exc_before:
                span.__exit__(*exc)
            else:
                span.__exit__(None, None, None)

        self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True, prepend=True))
        self._handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))

    def remove(self) -> None:
        """Take the hooks off and close a resolver this handle started (pending pairs get a
        second to resolve). Idempotent."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._owns_resolver and self.resolver is not None:
            self._owns_resolver = False
            self.resolver.close()
        if self.failed:
            logger.warning("ttft torch hooks: %d gpu timings failed", self.failed)

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def instrument_module(
    module: torch.nn.Module,
    *,
    stage: str = "forward",
    per_layer: bool = False,
    gpu: bool | GpuResolver = True,
) -> Instrumentation:
    """Record a span for every forward of ``module`` (see the module docstring).

    Args:
        module: the module to hook; its forward may run on any thread.
        stage: name (and stage) of the forward span.
        per_layer: also a ``<stage>.<child>`` span (stage ``other``, attribute ``layer``)
            per direct child; a ``ModuleList``/``ModuleDict`` child stands for its children.
        gpu: time forwards whose first input is a CUDA tensor with CUDA events (``gpu``
            spans), when CUDA is available; or the :class:`GpuResolver` to use (the caller
            closes it).

    Returns:
        The handle; ``remove()`` it or use it as a context manager.

    Span attributes: ``module`` (class name), ``timing``, ``tokens`` (positions in the
    first positional input), ``step_id`` (copied from the enclosing span), ``gpu`` on the
    forward span (``gpu:<index>`` when a ``gpu`` span follows, ``none`` when no device
    timing is possible, ``off`` with ``gpu=False``). A forward that raises an ``Exception``
    still closes its spans (``error`` attribute); torch runs no hooks for other
    ``BaseException``s. Not meant to be traced by ``torch.compile``.
    """
    if isinstance(gpu, GpuResolver):
        return Instrumentation(module, stage, per_layer, gpu, False, "none")
    if gpu and torch.cuda.is_available():
        return Instrumentation(module, stage, per_layer, GpuResolver(), True, "none")
    return Instrumentation(module, stage, per_layer, None, False, "none" if gpu else "off")
