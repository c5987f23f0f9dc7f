"""``kv_transfer``: a disaggregated request whose K/V transfer overlaps its prefill chunks,
attributed by hand under every policy, and the transfer's blame."""

from __future__ import annotations

import pytest
from _build import event, row, table, tid

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.analysis.blame import blame
from ttft.tracer.schema import ATTR_KV_BLOCKS, ATTR_KV_BYTES, PRIORITY

PREFILL = {"service": "prefill-worker"}
DECODE = {"service": "decode-worker"}
KV = {ATTR_KV_BLOCKS: 4, ATTR_KV_BYTES: 4 * 65536}


def disaggregated() -> list[dict]:
    """Prefill worker: queue, two chunks with a gap; the transfer starts inside the first
    chunk and its last block is installed 15 ns after the last chunk; decode worker: its
    queue, the first token sampled there, then the server's send."""
    return [
        row(1, 1, "server", 0, 100, request_id="r1", cached_tokens=0),
        row(1, 2, "tokenize", 2, 10, parent=1),
        row(1, 3, "queue", 10, 20, parent=1, **PREFILL),
        row(1, 4, "prefill", 20, 60, parent=1, **PREFILL),
        row(1, 5, "prefill.chunk", 20, 35, parent=4, step_id=1, chunk_tokens=16, **PREFILL),
        row(1, 6, "prefill.chunk", 45, 60, parent=4, step_id=2, chunk_tokens=16, **PREFILL),
        row(1, 7, "kv_transfer", 30, 75, parent=1, **DECODE, **KV),
        row(1, 8, "queue", 75, 80, parent=1, **DECODE),
        row(1, 9, "sample", 80, 85, parent=1, **DECODE),
        event(1, 10, "first_sampled", 85, parent=1, **DECODE),
        row(1, 11, "stream", 88, 92, parent=1),
        event(1, 12, "first_byte", 92, parent=1),
    ]


EXPECTED = {
    # The chunks outrank the transfer where they overlap ([30, 35) and [45, 60)): that
    # part of the transfer is hidden behind prefill compute. The transfer outranks the
    # prefill envelope, so the gap between chunks it covers ([35, 45)) and its tail after
    # the last chunk ([60, 75)) are kv_transfer: 25 ns.
    "exclusive": {"server": 2 + 3, "tokenize": 8, "queue": 10 + 5, "prefill.chunk": 15 + 15,
                  "kv_transfer": 10 + 15, "sample": 5, "stream": 4},
    # Overlaps split evenly, the odd ns to the higher key (the chunk): [30, 35) 3 chunk /
    # 2 transfer, [35, 45) 5 envelope / 5 transfer, [45, 60) 8 chunk / 7 transfer.
    "shared": {"server": 5, "tokenize": 8, "queue": 15, "prefill.chunk": 10 + 3 + 8,
               "prefill": 5, "kv_transfer": 2 + 5 + 7 + 15, "sample": 5, "stream": 4},
    # Walking back from first_byte: the transfer ends last before the decode queue, so all
    # of it, [30, 75), is on the critical path; the prefill (ending inside it) is not, and
    # [20, 30) between the prefill queue and the transfer's start is the server's.
    "critical-path": {"server": 2 + 10 + 3, "tokenize": 8, "queue": 10 + 5,
                      "kv_transfer": 45, "sample": 5, "stream": 4},
}


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_transfer_overlapping_prefill_is_attributed_exactly(policy):
    result = attribute(assemble(table(disaggregated())), "server", policy)
    got = {k: int(v) for k, v in result.attributed.iloc[0].items() if v}
    assert got == EXPECTED[policy]
    assert sum(got.values()) == int(result.requests["ttft_ns"].iloc[0]) == 92


def test_transfer_ranks_between_the_chunks_and_sampling():
    assert PRIORITY["prefill.chunk"] > PRIORITY["kv_transfer"] > PRIORITY["sample"]
    assert PRIORITY["kv_transfer"] > PRIORITY["prefill"] > PRIORITY["server"]


def test_engine_boundary_ends_at_the_decode_side_first_token():
    result = attribute(assemble(table(disaggregated())), "engine", "exclusive")
    got = {k: int(v) for k, v in result.attributed.iloc[0].items() if v}
    # [2, 85): no server, no stream; the rest as under the server boundary.
    assert got == {"tokenize": 8, "queue": 15, "prefill.chunk": 30, "kv_transfer": 25,
                   "sample": 5}


def test_blame_splits_the_transfer_after_the_last_chunk_by_the_decode_workers_steps():
    steps = [
        row(99, 90, "step", 50, 66, step_id=7, prefill_tokens=0, decode_tokens=8, **DECODE),
        row(99, 91, "step", 68, 72, step_id=8, prefill_tokens=10, decode_tokens=2, **DECODE),
    ]
    df = blame(assemble(table(disaggregated() + steps)))
    got = {r["wait"]: (r["wait_ns"], r["prefill_ns"], r["decode_ns"], r["unknown_ns"],
                       r["idle_ns"]) for r in df.to_dict("records")}
    assert set(df["trace_id"]) == {tid(1)}
    # The transfer waits only from the last chunk's end, [60, 75): step 7 over [60, 66) is
    # decode 6; step 8 over [68, 72) is floor(4 * 10 / 12) = 3 prefill, 1 decode; 5 idle.
    # Both queues (no steps on the prefill worker; [75, 80) after the decode steps) idle.
    assert got == {
        "queue": (15, 0, 0, 0, 15),
        "kv_transfer": (15, 3, 7, 0, 5),
        "between_chunks": (10, 0, 0, 0, 10),
    }


def test_a_transfer_hidden_by_prefill_is_no_wait():
    rows = [r for r in disaggregated() if r["name"] != "kv_transfer"]
    rows.append(row(1, 7, "kv_transfer", 30, 58, parent=1, **DECODE, **KV))
    df = blame(assemble(table(rows)))
    assert "kv_transfer" not in set(df["wait"])
