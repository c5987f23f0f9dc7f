"""``plan_step``, the engine's scheduling policy, called directly (no engine, no threads):
FCFS admission stopped by ``max_running`` or the K/V cache, requests held back by a
queue delay passed over, reclaimable prefix blocks counted once, the decode-first token
budget and chunking at ``chunk_size``; and, for any input, the plan's invariants."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ttft.engine import plan_step
from ttft.engine.policy import Running, StepPlan, Waiting

LIMITS = dict(max_batch_tokens=64, chunk_size=16, max_running=4)


def plan(waiting=(), running=(), free_blocks=100, **limits) -> StepPlan:
    return plan_step(list(waiting), list(running), free_blocks=free_blocks, **{**LIMITS, **limits})


def waiting(key, prompt_tokens=10, need_blocks=1, eligible=True, pinned=()) -> Waiting:
    return Waiting(key, eligible, prompt_tokens, need_blocks, frozenset(pinned))


def decoding(key, owed_blocks=0) -> Running:
    return Running(key, 0, owed_blocks)


def prefilling(key, prompt_tokens, owed_blocks=0) -> Running:
    return Running(key, prompt_tokens, owed_blocks)


def test_nothing_to_do_is_an_empty_plan():
    assert plan() == StepPlan((), (), ())


def test_admission_is_first_come_first_served_and_admitted_requests_run_at_once():
    p = plan([waiting("a", 10), waiting("b", 20), waiting("c", 5)], [decoding("r")])
    assert p.admit == ("a", "b", "c")
    assert p.decode == ("r",)
    assert p.prefill == (("a", 10), ("b", 16), ("c", 5))  # after the running request


def test_max_running_stops_admission():
    p = plan([waiting("a"), waiting("b")], [decoding("r1"), decoding("r2")], max_running=3)
    assert p.admit == ("a",)
    assert plan([waiting("a")], [decoding("r")], max_running=1).admit == ()


def test_a_request_held_back_by_a_queue_delay_is_passed_over():
    p = plan([waiting("held", eligible=False), waiting("b"), waiting("c")], max_running=2)
    assert p.admit == ("b", "c")
    # a held request still takes no slot, and nothing is admitted past max_running
    assert plan([waiting("held", eligible=False), waiting("b")], max_running=1).admit == ("b",)


def test_a_request_that_does_not_fit_the_cache_stops_admission():
    p = plan([waiting("big", need_blocks=5), waiting("small", need_blocks=1)], free_blocks=4)
    assert p.admit == ()  # FCFS: "small" does not overtake "big"
    p = plan([waiting("a", need_blocks=3), waiting("b", need_blocks=2)], free_blocks=4)
    assert p.admit == ("a",)


def test_blocks_owed_to_running_requests_are_reserved():
    running = [prefilling("r", 8, owed_blocks=3)]
    assert plan([waiting("a", need_blocks=3)], running, free_blocks=5).admit == ()
    assert plan([waiting("a", need_blocks=2)], running, free_blocks=5).admit == ("a",)


def test_a_prefix_hit_takes_its_reclaimable_blocks_out_of_the_room_once():
    a = waiting("a", need_blocks=2, pinned={1, 2})
    shared, apart = (
        waiting("b", need_blocks=2, pinned={1, 2}),
        waiting("b", need_blocks=2, pinned={3}),
    )
    assert plan([a, shared], free_blocks=6).admit == ("a", "b")  # 6 - 2 pinned >= 2 + 2 owed
    assert plan([a, apart], free_blocks=6).admit == ("a",)  # 6 - 3 pinned < 2 + 2 owed


def test_decode_tokens_come_first_then_prefill_chunks_in_admission_order():
    running = [prefilling("p1", 40), decoding("d1"), prefilling("p2", 40), decoding("d2")]
    p = plan(running=running, max_batch_tokens=20, chunk_size=16)
    assert p.decode == ("d1", "d2")
    assert p.prefill == (("p1", 16), ("p2", 2))  # 20 - 2 decode tokens, chunks of <= 16


def test_chunks_are_cut_at_chunk_size_and_at_the_prompt_left():
    p = plan(running=[prefilling("a", 40), prefilling("b", 5)], max_batch_tokens=100)
    assert p.prefill == (("a", 16), ("b", 5))


def test_a_budget_spent_on_decode_leaves_prefilling_requests_waiting():
    running = [decoding("d1"), decoding("d2"), prefilling("p", 8)]
    p = plan(running=running, max_batch_tokens=2, max_running=2)
    assert p.decode == ("d1", "d2") and p.prefill == ()


@st.composite
def states(draw):
    waiting_states = [
        Waiting(
            f"w{i}",
            draw(st.booleans()),
            draw(st.integers(1, 50)),
            draw(st.integers(0, 8)),
            frozenset(draw(st.sets(st.integers(0, 9), max_size=3))),
        )
        for i in range(draw(st.integers(0, 6)))
    ]
    running_states = [
        Running(f"r{i}", draw(st.integers(0, 50)), draw(st.integers(0, 8)))
        for i in range(draw(st.integers(0, 6)))
    ]
    max_batch_tokens = draw(st.integers(6, 80))
    limits = dict(
        free_blocks=draw(st.integers(0, 40)),
        max_batch_tokens=max_batch_tokens,
        chunk_size=draw(st.integers(1, 32)),
        max_running=draw(st.integers(max(1, len(running_states)), 6)),
    )
    return waiting_states, running_states, limits


@given(states())
def test_plan_invariants(case):
    waiting_states, running_states, limits = case
    p = plan_step(waiting_states, running_states, **limits)
    by_key = {w.key: w for w in waiting_states}
    # admitted: eligible, in arrival order, within max_running and the K/V room
    order = [w.key for w in waiting_states]
    assert [order.index(k) for k in p.admit] == sorted(order.index(k) for k in p.admit)
    assert all(by_key[k].eligible for k in p.admit)
    assert len(running_states) + len(p.admit) <= limits["max_running"]
    if p.admit:
        pinned = frozenset().union(*(by_key[k].pinned_blocks for k in p.admit))
        owed = sum(r.owed_blocks for r in running_states)
        owed += sum(by_key[k].need_blocks for k in p.admit)
        assert limits["free_blocks"] - len(pinned) >= owed
        # FCFS: an eligible request left waiting before the last admitted one was overtaken
        last = order.index(p.admit[-1])
        assert all(k in p.admit for k in order[:last] if by_key[k].eligible)
    # the step: within the budget, chunks within chunk_size and the prompt left
    left = {r.key: r.prompt_tokens for r in running_states}
    left |= {k: by_key[k].prompt_tokens for k in p.admit}
    assert len(p.decode) + sum(n for _, n in p.prefill) <= limits["max_batch_tokens"]
    assert all(0 < n <= min(limits["chunk_size"], left[k]) for k, n in p.prefill)
    assert set(p.decode) == {k for k, n in left.items() if n == 0}  # max_running <= budget
    assert all(left[k] > 0 for k, _ in p.prefill)


# -- recompute preemption ------------------------------------------------------------------


def growing(key, grow_blocks=1, held_blocks=2) -> Running:
    return Running(key, 0, 0, grow_blocks, held_blocks)


def test_without_preemption_growth_is_ignored():
    p = plan(running=[growing("a"), growing("b")], free_blocks=0)
    assert p.preempt == () and p.decode == ("a", "b")


def test_a_block_that_fits_preempts_nobody_and_leaves_less_room_to_admit():
    running = [growing("a"), growing("b", grow_blocks=0)]
    p = plan([waiting("w", need_blocks=2)], running, free_blocks=2, preempt=True)
    assert p.preempt == () and p.admit == ()  # 2 free - 1 for a's block < 2 needed
    p = plan([waiting("w", need_blocks=1)], running, free_blocks=2, preempt=True)
    assert p.admit == ("w",)


def test_the_request_admitted_last_is_preempted_for_a_decoding_request_s_block():
    running = [growing("a"), growing("b", grow_blocks=0), prefilling("p", 20, owed_blocks=3)]
    p = plan([waiting("w", need_blocks=0)], running, free_blocks=3, preempt=True)
    # 3 free, all owed to p's prefill: p goes (3 owed + 2 held back), a takes one
    assert p.preempt == (("p", "a"),)
    assert p.admit == ()  # a step that preempts admits nobody
    assert p.decode == ("a", "b") and p.prefill == ()


def test_requests_are_preempted_latest_first_until_the_block_fits():
    running = [growing("a"), growing("b", 0, held_blocks=1), growing("c", 0, held_blocks=0)]
    p = plan(running=running, free_blocks=0, preempt=True)
    assert p.preempt == (("c", "a"), ("b", "a"))  # c's blocks were all shared: b's too
    assert p.decode == ("a",)
    p = plan(running=[growing("a", held_blocks=0), growing("b", 0, held_blocks=0)],
             free_blocks=0, preempt=True)
    assert p.preempt == (("b", "a"), ("a", "a")) and p.decode == ()  # nothing fits it


def test_a_request_alone_without_room_is_preempted_for_its_own_block():
    running = [growing("a", 0), growing("b")]
    p = plan(running=running, free_blocks=0, preempt=True)
    assert p.preempt == (("b", "b"),) and p.decode == ("a",)


@given(states(), st.lists(st.tuples(st.integers(0, 1), st.integers(0, 4)), max_size=6))
def test_preemption_invariants(case, blocks):
    waiting_states, running_states, limits = case
    running_states = [
        Running(r.key, r.prompt_tokens, r.owed_blocks if r.prompt_tokens else 0,
                grow if not r.prompt_tokens else 0, held)
        for r, (grow, held) in zip(running_states, blocks + [(0, 0)] * 6, strict=False)
    ]
    p = plan_step(waiting_states, running_states, **limits, preempt=True)
    keys = [r.key for r in running_states]
    victims = [v for v, _ in p.preempt]
    # the latest admitted first, a suffix of the running requests
    assert victims == keys[::-1][: len(victims)]
    kept = [r for r in running_states if r.key not in victims]
    assert not set(victims) & (set(p.decode) | {k for k, _ in p.prefill})
    assert all(by in keys for _, by in p.preempt)
    assert not (p.preempt and p.admit)
    if not p.preempt:
        return
    # after it: room for the kept requests' reservations and next blocks, or nobody kept
    # that grows, or the last one preempted for its own block
    room = limits["free_blocks"] + sum(r.held_blocks for r in running_states if r.key in victims)
    need = sum(r.owed_blocks + r.grow_blocks for r in kept)
    assert room >= need or p.preempt[-1][0] == p.preempt[-1][1]
