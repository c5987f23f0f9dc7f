"""The step join's invariants on generated engine traces (analysis/_step_join.py): the
answer does not depend on row order, and each chunk joins exactly its step's work: the
gpu spans its own forward launched (an engine running a step's chunks one forward each),
or every gpu span of its step (one forward for the whole batch), whatever the step ids."""

from __future__ import annotations

import random

import pytest
from _build import event, row, table
from hypothesis import given, settings
from hypothesis import strategies as st

from ttft.analysis import _column_arrays
from ttft.analysis.assemble import assemble

ENGINE = 999


def _trace(seed: int, batches: int, ids: int, batched: bool
           ) -> tuple[list[dict], dict[tuple[int, int], set[int]]]:
    """Rows of ``batches`` steps of 1-3 requests (one chunk each), the step ids drawn from
    ``ids`` values (reused), and what each chunk ``(trace, span)`` must join."""
    rng = random.Random(seed)
    rows, expected, sid, req = [], {}, 1, 0
    for b in range(batches):
        base = 3_000 * b + rng.randrange(0, 200)
        step, step_span = rng.randrange(ids), sid
        rows.append(row(ENGINE, step_span, "step", base, base + 2_500, step_id=step))
        sid += 1
        batch_gpus: set[int] = set()
        members = []
        if batched:  # one forward before the chunks, its work for all of them
            rows.append(row(ENGINE, sid, "forward", base + 1, base + 5, parent=step_span))
            forward, sid = sid, sid + 1
        for j in range(rng.randrange(1, 4)):
            req += 1
            c0 = base + 10 + 700 * j
            c1 = c0 + rng.randrange(50, 600)
            rows += [row(req, 1, "server", base, base + 2_900),
                     row(req, 2, "prefill.chunk", c0, c1, parent=1, step_id=step),
                     event(req, 3, "first_byte", base + 2_800, parent=1)]
            own: set[int] = set()
            if not batched:  # its own forward inside its chunk
                rows.append(row(ENGINE, sid, "forward", c0 + 1, c0 + 5, parent=step_span))
                forward, sid = sid, sid + 1
            for d in range(rng.choice([1, 2]) if not batched or j == 0 else 0):
                g0 = (c0 if not batched else base) + 5 + rng.randrange(0, 300)
                rows.append(row(ENGINE, sid, "gpu", g0, g0 + rng.randrange(1, 900),
                                parent=forward, step_id=step, clock=f"gpu:{d}"))
                own.add(sid)
                sid += 1
            batch_gpus |= own
            members.append((req, 2))
            expected[(req, 2)] = own
        if batched:
            expected.update(dict.fromkeys(members, batch_gpus))
    return rows, expected


def _joined(rows: list[dict]) -> dict[tuple[int, int], set[int]]:
    asm = assemble(table(rows))
    t = asm.rows.table
    trace = [int(x, 16) for x in t.column("trace_id").to_pylist()]
    span = [int(x, 16) for x in t.column("span_id").to_pylist()]
    out: dict[tuple[int, int], set[int]] = {}
    for c, g in zip(asm.rows.gpu_chunk.tolist(), asm.rows.gpu_row.tolist(), strict=True):
        out.setdefault((trace[c], span[c]), set()).add(span[g])
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), batches=st.integers(1, 8), ids=st.integers(1, 3),
       batched=st.booleans())
def test_each_chunk_joins_its_own_steps_work_in_any_row_order(seed, batches, ids, batched):
    rows, expected = _trace(seed, batches, ids, batched)
    want = {chunk: gpus for chunk, gpus in expected.items() if gpus}
    assert _joined(rows) == want
    shuffled = rows[:]
    random.Random(seed + 1).shuffle(shuffled)
    assert _joined(shuffled) == want


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), batches=st.integers(1, 8), ids=st.integers(1, 3),
       batched=st.booleans())
def test_the_compiled_launches_join_the_same_work(seed, batches, ids, batched):
    """With the compiled kernels of large tables (``_kernels.first_of_keys`` finding each
    gpu span's forward), each chunk still joins exactly its step's work."""
    rows, expected = _trace(seed, batches, ids, batched)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_column_arrays, "KERNEL_ROWS", 1)
        assert _joined(rows) == {chunk: gpus for chunk, gpus in expected.items() if gpus}
