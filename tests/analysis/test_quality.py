"""Malformed traces: every defect is counted, and the valid requests around it survive."""

from __future__ import annotations

import pyarrow as pa
from _build import event, row, table
from test_attribution import CLIENT, one_request

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.tracer.schema import SPAN_SCHEMA


def good_parts() -> dict[str, int]:
    result = attribute(assemble(table(one_request())), "client", "exclusive")
    return result.attributed.iloc[0].to_dict()


def test_clean_trace_has_no_defects():
    assert attribute(assemble(table(one_request())), "client").quality.total == 0


def test_each_defect_is_counted_and_the_good_request_is_unchanged():
    bad = [
        # trace 7: a span ending before it starts, an orphan, a duplicate span id,
        # a span wholly outside its server span, and a server outside its client span.
        row(7, 70, "client", 1000, 1100, **CLIENT),
        row(7, 71, "server", 990, 1090, parent=70),
        row(7, 72, "queue", 1050, 1040, parent=71),
        row(7, 73, "tokenize", 1000, 1010, parent=99),
        row(7, 74, "schedule", 1010, 1020, parent=71),
        row(7, 74, "schedule", 1010, 1020, parent=71),
        row(7, 75, "sample", 2000, 2010, parent=71),
        event(7, 76, "first_token", 1095, **CLIENT),
        # trace 8: a server span without first_byte: no server window.
        row(8, 80, "server", 0, 10, request_id="r8"),
    ]
    result = attribute(assemble(table(one_request() + bad)), "server", "exclusive")
    assert result.quality.counts == {
        "missing_field": 0,
        "end_before_start": 1,
        "no_window": 2,  # traces 7 and 8 have no first_byte
        "orphan_parent": 1,
        "duplicate_span_id": 1,
        "outside_window": 1,
        "clock_shift": 1,
        "rejected_span": 0,
        "estimated_span": 0,
        "reused_step_id": 0,
    }
    assert result.quality.examples["orphan_parent"] == [format(7, "032x")]
    client = attribute(assemble(table(one_request() + bad)), "client", "exclusive")
    first = client.requests.index[client.requests.trace_id == format(1, "032x")][0]
    assert client.attributed.iloc[first].to_dict() == good_parts()


def test_rows_with_missing_fields_are_dropped_and_counted():
    rows = one_request()
    tab = table(rows)
    start = tab.column("start_ns").to_pylist()
    start[3] = None  # tokenize loses its start
    tab = tab.set_column(6, SPAN_SCHEMA.field("start_ns"), pa.array(start, pa.int64()))
    result = attribute(assemble(tab), "client", "exclusive")
    assert result.quality.counts["missing_field"] == 1
    span_id = tab.column("span_id")[3].as_py()
    assert result.quality.examples["missing_field"] == [f"span {span_id}"]  # not its position
    parts = result.attributed.iloc[0]
    assert parts["tokenize"] == 0 and int(parts.sum()) == 90


def test_examples_are_the_smallest_distinct_ones_in_one_part_or_several():
    """A trace id named by several rows (chunks of one request) is one example: one part
    kept ['a'] of a, a, a, b, c while two parts merged kept a, b, c."""
    from ttft.analysis.quality import Quality

    whole = Quality()
    whole.add("reused_step_id", 5, ["a", "a", "a", "b", "c"])
    first, second = Quality(), Quality()
    first.add("reused_step_id", 3, ["a", "a", "a"])
    second.add("reused_step_id", 2, ["b", "c"])
    assert whole.examples["reused_step_id"] == ["a", "b", "c"]
    assert first.merged(second).examples == whole.examples


def test_a_counted_defect_in_metadata_is_a_non_negative_integer():
    """Run metadata's ``rejected``/``estimated`` counts as the readers that sum runs read
    them (``tracer.schema.counted_sums``): a negative, a bool or a text count is malformed,
    counted as 0, so one trace file and a directory of it give one answer."""
    import json

    from ttft.analysis.quality import estimated_spans, rejected_spans
    from ttft.tracer.schema import METADATA_KEY, counted_sums

    base = table(one_request())
    for count, expected in ((4, 4), (-3, 0), (True, 0), ("2", 0), (0, 0)):
        meta = {"rejected": {"count": count, "examples": ["x"]},
                "estimated": {"count": count}}
        t = base.replace_schema_metadata({METADATA_KEY: json.dumps(meta)})
        assert rejected_spans(t)[0] == expected and estimated_spans(t)[0] == expected
        summed = counted_sums([meta]).get("rejected", {}).get("count", 0)
        assert summed == expected
