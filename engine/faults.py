"""Fault injection: known delays added to chosen stages of every request, so a tool that
attributes TTFT can be checked against a delay it must find (``ttft validate``).

A delay lands inside its stage's span: ``tokenize`` and ``detokenize`` sleep on the
request's own asyncio path (other requests go on); ``queue`` makes a request eligible for
admission that much after its arrival (later requests may be admitted before it);
``schedule`` and ``sample`` sleep in the engine's worker thread, so they delay the whole
step; ``kv_transfer`` (disaggregated serving only, ``ttft.engine.disagg``; the co-located
engine has no transfer and ignores it) sleeps in the prefill worker's thread after the
request's first K/V block went out and before its last one goes, so it lies inside the
``kv_transfer`` span and before the first token is sampled. Delays are in milliseconds,
per stage, in a plain ``dict[str, float]``.
"""

from __future__ import annotations

import asyncio
import time

__all__ = [
    "DELAY_STAGES",
    "async_sleep_for",
    "check_delays",
    "delay_ns",
    "merge_delays",
    "sleep_for",
]

DELAY_STAGES = ("tokenize", "queue", "schedule", "sample", "detokenize", "kv_transfer")
"""The stages ``inject_delay_ms`` can delay (each delay lands inside that stage's span)."""


def check_delays(delays_ms: dict[str, float]) -> None:
    """Refuse delays for a stage not in ``DELAY_STAGES`` and negative delays.

    Raises:
        ValueError: naming the unknown stages or the delays.
    """
    bad = sorted(set(delays_ms) - set(DELAY_STAGES))
    if bad:
        raise ValueError(f"inject_delay_ms: unknown stage(s) {bad}; choose from {DELAY_STAGES}")
    if any(v < 0 for v in delays_ms.values()):
        raise ValueError(f"inject_delay_ms: delays must be >= 0, got {delays_ms}")


def merge_delays(
    configured_ms: dict[str, float], request_ms: dict[str, float] | None
) -> dict[str, float]:
    """One request's delays: the engine's, overridden per stage by the request's own.

    Raises:
        ValueError: as ``check_delays``.
    """
    delays = {**configured_ms, **(request_ms or {})}
    check_delays(delays)
    return delays


def delay_ns(delays_ms: dict[str, float], stage: str) -> int:
    """The delay of ``stage`` in whole nanoseconds (0 when none)."""
    return int(delays_ms.get(stage, 0.0) * 1e6)


def sleep_for(delays_ms: dict[str, float], stage: str) -> None:
    """Block the calling thread for ``stage``'s delay (the worker's stages)."""
    delay_ms = delays_ms.get(stage, 0.0)
    if delay_ms:
        time.sleep(delay_ms / 1e3)


async def async_sleep_for(delays_ms: dict[str, float], stage: str) -> None:
    """Suspend the calling task for ``stage``'s delay (the request's asyncio stages)."""
    delay_ms = delays_ms.get(stage, 0.0)
    if delay_ms:
        await asyncio.sleep(delay_ms / 1e3)
