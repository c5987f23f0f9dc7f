"""Torch module hooks: a host span per forward pass and, on CUDA, its device time.

What each span measures (STYLE.md rule 6):

- ``forward`` (``timing="host"``): pre-hook to forward hook, on the calling thread and the
  host clock. On CUDA this is host *enqueue* time: its kernels may still be running after.
  ``forward.<child>`` spans (stage ``other``, ``per_layer=True``) are the same per child.
- ``gpu`` (``timing="device"``, clock ``gpu:<index>``): device time between two CUDA events
  recorded on the current stream around the forward, a child of its forward span, mapped
  to the host clock through an anchor event (``ttft.tracer.gpu_resolver``). Without CUDA
  the forward span says ``gpu="none"`` and no ``gpu`` span follows.

Threading: hooks run on the thread that calls the module. Each hooked module keeps a
per-thread stack of open spans, so recursion and calls from several threads nest
correctly. CUDA events are resolved off the hot path by :class:`GpuResolver`'s thread;
the traced thread never synchronizes, except once for a device without an anchor.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

from ttft.tracer import api
from ttft.tracer.gpu_resolver import GpuResolver
from ttft.tracer.schema import ATTR_STEP_ID

__all__ = ["Instrumentation", "instrument_module"]

logger = logging.getLogger(__name__)
_GPU_KEYS = ("module", "tokens", ATTR_STEP_ID)  # forward attributes a gpu span repeats


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
