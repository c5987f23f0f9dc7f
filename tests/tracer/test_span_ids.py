"""Schema version 2's ids as bytes (``tracer.span_ids``): converted from and back to hex
text without loss for W3C ids, refused for any other id, and never mixed in one table."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ttft.tracer.schema import SPAN_SCHEMA, SPAN_SCHEMA_V2
from ttft.tracer.span_ids import hex_words, is_v2, same_layout, to_v1, to_v2

_hex = st.sampled_from("0123456789abcdef")
_trace = st.text(_hex, min_size=32, max_size=32)
_span = st.one_of(st.none(), st.just(""), st.text(_hex, min_size=16, max_size=16))


def _table(rows: list[tuple], chunk: int) -> pa.Table:
    columns = {"trace_id": [r[0] for r in rows], "span_id": [r[1] for r in rows],
               "parent_id": [r[2] for r in rows], "request_id": [None] * len(rows),
               "name": ["s"] * len(rows), "stage": ["other"] * len(rows),
               "start_ns": list(range(len(rows))), "end_ns": list(range(len(rows))),
               "clock": ["client"] * len(rows), "service": ["x"] * len(rows),
               "attributes": [None] * len(rows)}
    whole = pa.Table.from_pydict(columns, schema=SPAN_SCHEMA)
    pieces = [whole.slice(i, chunk) for i in range(0, max(len(rows), 1), chunk)]
    return pa.concat_tables(pieces).replace_schema_metadata({b"k": b"v"})


@given(st.lists(st.tuples(_trace, _span, _span), max_size=40), st.integers(1, 9))
def test_w3c_ids_round_trip_and_an_empty_id_becomes_null(rows, chunk):
    table = _table(rows, chunk)
    stored = to_v2(table)
    assert stored is not None and is_v2(stored.schema)
    assert stored.schema.remove_metadata() == SPAN_SCHEMA_V2
    assert stored.schema.metadata == {b"k": b"v"}
    assert stored.column("trace_id").to_pylist() == [bytes.fromhex(r[0]) for r in rows]
    assert stored.column("span_id").to_pylist() == [bytes.fromhex(r[1]) if r[1] else None
                                                    for r in rows]
    back = to_v1(stored)
    want = [tuple(v or None for v in r) for r in rows]  # "" names no span, as null does
    ids = [back.column(c).to_pylist() for c in ("trace_id", "span_id", "parent_id")]
    assert list(zip(*ids, strict=True)) == want
    assert back.schema == table.schema
    assert [back.column(c).to_pylist() for c in ("name", "start_ns")] == [
        table.column(c).to_pylist() for c in ("name", "start_ns")]
    assert to_v1(table) is table and to_v2(stored) is stored


@pytest.mark.parametrize("bad", [
    ("t1", "00" * 8, None),  # a trace id that is no W3C id
    ("ab" * 16, "0" * 15, None),  # a span id of 15 digits
    ("ab" * 16, "0" * 32, None),  # a trace id's width in the span id
    ("ab" * 16, "g" + "0" * 15, None),  # not hex
    ("ab" * 15 + "a", None, None),  # 31 digits
    ("", None, None),  # an empty trace id
    ("AB" * 16, None, None),  # upper case: its text is kept as it is, in version 1
    ("ab" * 16, "Cd" * 8, None),
])
def test_any_other_id_keeps_the_table_in_version_1(bad):
    good = ("cd" * 16, "11" * 8, "22" * 8)
    assert to_v2(_table([good, bad, good], 2)) is None


def test_a_null_trace_id_keeps_the_table_in_version_1():
    table = _table([("cd" * 16, None, None)], 1)
    nulls = pa.array([None], pa.string())
    loose = pa.table({**{c: table.column(c) for c in table.column_names}, "trace_id": nulls})
    assert to_v2(loose) is None


def test_tables_of_both_layouts_are_read_as_version_1_and_empty_ones_follow_the_rest():
    v1 = _table([("cd" * 16, "11" * 8, None)], 1)
    v2 = to_v2(v1)
    empty = SPAN_SCHEMA.empty_table()
    assert [is_v2(t.schema) for t in same_layout([v2, empty, v2])] == [True] * 3
    assert [is_v2(t.schema) for t in same_layout([v2, v1])] == [False, False]
    assert [is_v2(t.schema) for t in same_layout([empty])] == [False]
    assert pa.concat_tables(same_layout([v2, v1])).column("span_id").to_pylist() == ["11" * 8] * 2


@given(st.lists(st.binary(min_size=8, max_size=8), max_size=20))
def test_hex_words_are_the_words_of_the_hex_text(ids):
    import numpy as np

    raw = np.frombuffer(b"".join(ids), np.uint8).reshape(-1, 8)
    words = hex_words(raw)
    text = b"".join(i.hex().encode() for i in ids)
    assert words.tolist() == np.frombuffer(text, ">u8").reshape(-1, 2).tolist()


def test_a_chunk_of_more_text_than_one_array_holds_is_cut(monkeypatch):
    from ttft.tracer import span_ids

    table = _table([(f"{i:032x}", f"{i:016x}", None) for i in range(10)], 10)
    stored = to_v2(table)
    monkeypatch.setattr(span_ids, "_MOST_TEXT", 3 * 32)  # three trace ids a piece
    with pytest.raises(ValueError, match="hex_texts"):
        span_ids.hex_text(stored.column("trace_id").chunk(0))
    back = to_v1(stored)
    assert back.column("trace_id").num_chunks == 4
    assert back.column("trace_id").to_pylist() == table.column("trace_id").to_pylist()
