"""The scheduling policy of one engine iteration, as a pure function: ``plan_step``.

As in vLLM and Sarathi-Serve, every iteration is planned from scratch. Admission is first
come, first served: waiting requests are admitted in arrival order while ``max_running``
and the K/V cache allow; one that is not eligible yet (an injected queue delay) is passed
over, and one that does not fit the cache stops admission, so nobody overtakes it. The
step's token budget then goes to one decode token per decoding request first, then to
prefill chunks (each at most ``chunk_size`` tokens) of the requests still prefilling, in
admission order.

K/V room is reserved for every block a request can still grow into (prompt plus
``max_tokens``), so no step ever finds the cache full. A request's prefix-cache hit costs
no new blocks, but its blocks that only the prefix cache holds stop being reclaimable
once the request uses them.

With ``preempt`` (recompute preemption, as vLLM V1 does it), room is reserved only for the
prompt tokens a request still has to compute; a decoding request takes its next block when
its next token needs one. When the room left cannot hold that block, the running request
admitted last is preempted (vLLM's FCFS ``self.running.pop()``), again until the block
fits or the request itself was the one preempted; a step that preempts admits nobody. The
engine frees a preempted request's blocks and puts it back at the front of the waiting
queue, to recompute its prompt and the tokens it generated when it is admitted again.

No threads, no torch, no tracing: the engine (``ttft.engine.engine``) describes its
requests with ``Waiting`` and ``Running`` and carries the plan out.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Running", "StepPlan", "Waiting", "plan_step"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Waiting(Generic[K]):
    """A waiting request as the policy sees it.

    Attributes:
        key: the caller's handle of the request, given back in the plan.
        eligible: whether it may be admitted now (False while an injected queue delay
            holds it back).
        prompt_tokens: prompt tokens it will compute once admitted (its prefix-cache hit
            excluded).
        need_blocks: K/V blocks it would still allocate to grow to its prompt plus
            ``max_tokens`` (the blocks of its prefix-cache hit excluded).
        pinned_blocks: the blocks of its prefix-cache hit that only the prefix cache holds
            now (reclaimable until the request attaches them).
    """

    key: K
    eligible: bool
    prompt_tokens: int
    need_blocks: int
    pinned_blocks: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Running(Generic[K]):
    """An admitted request as the policy sees it.

    Attributes:
        key: the caller's handle of the request, given back in the plan.
        prompt_tokens: prompt tokens still to prefill; 0 once it decodes.
        owed_blocks: K/V blocks it can still grow into (reserved for it); with preemption,
            the blocks its prefill still needs.
        grow_blocks: with preemption, the blocks its next decode token allocates (0 or 1;
            0 while it prefills); unused without.
        held_blocks: with preemption, the blocks preempting it gives back (free, or held
            only by the prefix cache): those no other running request shares.
    """

    key: K
    prompt_tokens: int
    owed_blocks: int
    grow_blocks: int = 0
    held_blocks: int = 0


@dataclass(frozen=True)
class StepPlan(Generic[K]):
    """What one iteration does.

    Attributes:
        admit: waiting requests to admit, in order (they run in this step too).
        prefill: ``(key, chunk tokens)`` per prefilling request served, in admission order.
        decode: requests that decode one token each, in admission order.
        preempt: ``(preempted, needed by)`` per running request preempted before the step
            runs, latest admitted first: the decoding request whose next block it made room
            for (itself when it was preempted for its own block).
    """

    admit: tuple[K, ...]
    prefill: tuple[tuple[K, int], ...]
    decode: tuple[K, ...]
    preempt: tuple[tuple[K, K], ...] = ()


def plan_step(
    waiting: Sequence[Waiting[K]],
    running: Sequence[Running[K]],
    *,
    free_blocks: int,
    max_batch_tokens: int,
    chunk_size: int,
    max_running: int,
    preempt: bool = False,
) -> StepPlan[K]:
    """Plan one iteration: preemptions, admissions, then the step's prefill chunks and
    decode tokens.

    Args:
        waiting: the waiting requests in arrival order (a prefix of the queue is enough
            when it holds ``max_running - len(running)`` eligible ones).
        running: the admitted requests in admission order.
        free_blocks: K/V blocks free now or held only by the prefix cache (reclaimable).
        max_batch_tokens: tokens the step may run (decode tokens plus prefill chunks).
        chunk_size: the most prompt tokens of one request in one step.
        max_running: requests admitted at once.
        preempt: recompute preemption (module docstring): ``free_blocks`` is then needed
            whenever a running request has ``grow_blocks``.

    Returns:
        The plan; admitted requests are served in admission order after ``running``
        (those preempted left out).
    """
    preempted: list[tuple[K, K]] = []
    if preempt:
        running, preempted, free_blocks = _preempt(running, free_blocks)
    admitted = [] if preempted else _admit(waiting, running, free_blocks, max_running)
    batch = [(r.key, r.prompt_tokens) for r in running]
    batch += [(w.key, w.prompt_tokens) for w in admitted]
    budget = max_batch_tokens
    decode = [key for key, left in batch if left == 0][:budget]
    budget -= len(decode)
    prefill: list[tuple[K, int]] = []
    for key, left in batch:
        if left == 0 or budget <= 0:
            continue
        n = min(chunk_size, left, budget)
        prefill.append((key, n))
        budget -= n
    return StepPlan(tuple(w.key for w in admitted), tuple(prefill), tuple(decode),
                    tuple(preempted))


def _preempt(
    running: Sequence[Running[K]], free_blocks: int
) -> tuple[list[Running[K]], list[tuple[K, K]], int]:
    """The running requests kept, those preempted (with the request each made room for)
    and the room left for admissions once the kept requests' next blocks are taken."""
    kept = list(running)
    room = free_blocks - sum(r.owed_blocks for r in running)
    preempted: list[tuple[K, K]] = []
    for req in running:
        if req.grow_blocks == 0 or req not in kept:
            continue
        while room < req.grow_blocks:
            victim = kept.pop()  # the latest admitted (FCFS)
            preempted.append((victim.key, req.key))
            room += victim.held_blocks + victim.owed_blocks
            if victim is req:
                break
        if preempted and preempted[-1][0] == req.key:
            break  # it gave its own blocks back: those after it were preempted already
        room -= req.grow_blocks
    # _admit subtracts the kept requests' owed blocks from what it is given
    return kept, preempted, room + sum(r.owed_blocks for r in kept)


def _admit(
    waiting: Sequence[Waiting[K]],
    running: Sequence[Running[K]],
    free_blocks: int,
    max_running: int,
) -> list[Waiting[K]]:
    """The waiting requests admitted first come, first served."""
    owed = sum(r.owed_blocks for r in running)
    pinned: frozenset[int] = frozenset()
    admitted: list[Waiting[K]] = []
    for req in waiting:
        if len(running) + len(admitted) >= max_running:
            break
        if not req.eligible:
            continue  # an injected queue delay holds back only this request
        pins = pinned | req.pinned_blocks
        if free_blocks - len(pins) < owed + req.need_blocks:
            break  # FCFS: nobody overtakes a request waiting for K/V room
        pinned, owed = pins, owed + req.need_blocks
        admitted.append(req)
    return admitted
