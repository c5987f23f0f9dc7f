"""``preemptions``: each preempted span with the requests that took its blocks and those
the engine's steps served meanwhile."""

from __future__ import annotations

from _build import row, table, tid

from ttft.analysis.assemble import assemble
from ttft.analysis.preemption import COLUMNS, preemptions

ENGINE = 99


def step(span: int, start_ns: int, end_ns: int, **attrs) -> dict:
    return row(ENGINE, span, "step", start_ns, end_ns, **attrs)


def test_a_preempted_span_names_who_took_its_blocks_and_who_ran():
    rows = [
        row(1, 1, "preempted", 100, 200, request_id="b", preempted_by=["a"], step_id=7,
            blocks_freed=3, generated_tokens=0),
        row(2, 1, "queue", 0, 10, request_id="a"),
        step(1, 90, 110, request_ids=["a", "b"]),  # b's last step before it: b is left out
        step(2, 120, 150, request_ids=["a", "c"]),
        step(3, 200, 210, request_ids=["d"]),  # starts at the end: not overlapping
        step(4, 130, 140, request_ids=["e"], service="other"),  # another engine
    ]
    assert preemptions(assemble(table(rows))).to_dict("records") == [{
        "trace_id": tid(1), "request_id": "b", "condition": None, "start_ns": 100,
        "preempted_ns": 100, "preempted_by": ("a",), "ran": ("a", "c"), "step_id": 7,
        "blocks_freed": 3, "generated_tokens": 0,
    }]


def test_missing_or_malformed_attributes_are_empty_or_minus_one():
    rows = [row(1, 1, "preempted", 0, 5, request_id="x", preempted_by="a", blocks_freed="3"),
            row(2, 1, "preempted", 0, 5, request_id="y", preempted_by=[1, 2])]
    found = preemptions(assemble(table(rows)))
    assert found[["preempted_by", "ran", "step_id", "blocks_freed"]].values.tolist() == [
        [(), (), -1, -1], [(), (), -1, -1]]


def test_no_preempted_span_is_an_empty_frame_with_the_columns():
    found = preemptions(assemble(table([row(1, 1, "queue", 0, 5)])))
    assert list(found.columns) == list(COLUMNS) and len(found) == 0
    assert found["preempted_ns"].dtype == "int64"
