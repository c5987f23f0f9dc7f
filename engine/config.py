"""``EngineConfig``: the engine's scheduler limits, K/V cache shape and injected delays."""

from __future__ import annotations

from dataclasses import dataclass, field

from ttft.engine.faults import check_delays

__all__ = ["PREEMPTION_MODES", "EngineConfig"]

PREEMPTION_MODES = ("off", "recompute")
"""``EngineConfig.preemption``: ``off`` reserves every block a request can grow into at
admission, so nothing is ever preempted; ``recompute`` reserves only its prompt's and
preempts the request admitted last when a decoding request needs a block and none is
left (``ttft.engine.policy``)."""


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler limits and the K/V cache shape.

    Attributes:
        max_batch_tokens: tokens one step may run (decode tokens plus prefill chunks).
        chunk_size: the most prompt tokens of one request in one step.
        max_queue: waiting requests beyond which ``submit`` raises ``QueueFull``.
        num_blocks, block_size: the paged K/V cache.
        max_running: requests admitted at once (prefilling or decoding).
        inject_delay_ms: known delays per stage (``tokenize``, ``queue``, ``schedule``,
            ``sample``, ``detokenize``), added to every request. ``tokenize`` and
            ``detokenize`` sleep on the request's own asyncio path; ``queue`` makes a
            request eligible for admission that much after its arrival (later requests
            may be admitted before it); ``schedule`` and ``sample`` sleep in the worker,
            so they delay the whole step; ``kv_transfer`` delays a disaggregated engine's
            K/V transfer and does nothing here (``ttft.engine.faults``).
        preemption: one of `PREEMPTION_MODES`: ``off`` (the default) or ``recompute``,
            vLLM V1's recompute preemption: a preempted request's blocks are freed and it
            waits at the front of the queue to recompute its prompt and the tokens it
            generated (the ``preempted`` stage, ``ttft.engine.spans``).

    Raises:
        ValueError: a limit under 1, ``max_running`` outside 1..``max_batch_tokens``, an
            unknown ``preemption``, or bad delays (``ttft.engine.faults.check_delays``).
    """

    max_batch_tokens: int = 512
    chunk_size: int = 256
    max_queue: int = 64
    num_blocks: int = 1024
    block_size: int = 16
    max_running: int = 16
    inject_delay_ms: dict[str, float] = field(default_factory=dict)
    preemption: str = "off"

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "chunk_size", "max_queue", "num_blocks", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.max_running <= self.max_batch_tokens:
            raise ValueError(
                f"max_running must be in 1..max_batch_tokens ({self.max_batch_tokens}), "
                f"got {self.max_running}"
            )
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {', '.join(PREEMPTION_MODES)}, "
                             f"got {self.preemption!r}")
        check_delays(self.inject_delay_ms)
