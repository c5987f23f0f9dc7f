"""Column conversions: span ids, integer attributes, grouping."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given
from hypothesis import strategies as st

from ttft.analysis._column_arrays import codes, group_order, int64, int_attribute, narrow
from ttft.analysis._id_words import id_values, id_words


def test_hex_ids_compare_like_their_strings():
    ids = ["00000000000000ff", None, "ffffffffffffffff", "0000000000000100", "a000000000000000"]
    hi, lo, present = id_values(pa.array(ids))
    assert present.tolist() == [True, False, True, True, True]
    keys = [(int(h), int(x)) for h, x in zip(hi, lo, strict=True)]
    order = sorted(range(5), key=lambda i: keys[i])
    assert [ids[i] for i in order if ids[i]] == sorted(i for i in ids if i)


def test_other_ids_fall_back_to_ranks():
    hi, lo, present = id_values(pa.array(["b", "a", None, "c"]))
    assert hi.tolist() == [1, 0, 0, 2] and present.tolist() == [True, True, False, True]


def test_other_ids_rank_alike_in_span_and_parent_columns():
    # Ranked per column, the parent "x" (rank 1 among its column's {b, x}) would equal the
    # span "c" (rank 1 among {b, c, x}).
    spans, parents = pa.array(["x", "b", "c"]), pa.array([None, "x", "b"])
    (s_hi, s_lo, _), (p_hi, p_lo, has_p) = id_words((spans, None), (parents, None))
    span_keys = [(int(h), int(x)) for h, x in zip(s_hi, s_lo, strict=True)]
    parent_keys = [(int(h), int(x)) for h, x in zip(p_hi, p_lo, strict=True)]
    assert has_p.tolist() == [False, True, True]
    assert parent_keys[1] == span_keys[0] and parent_keys[2] == span_keys[1]
    assert len(set(span_keys)) == 3


@given(st.lists(st.one_of(st.none(), st.sampled_from(["00000000000000ff", "a000000000000000",
                                                       "ffffffffffffffff", "short"])),
                min_size=1, max_size=30),
       st.data())
def test_id_words_at_rows_equal_the_whole_column_there(ids, data):
    rows = np.asarray(data.draw(st.lists(st.integers(0, len(ids) - 1), max_size=40)), np.int64)
    column = pa.chunked_array([pa.array(ids[:3], pa.string()), pa.array(ids[3:], pa.string())])
    (hi, lo, present), (whole_hi, whole_lo, whole_present) = id_words(
        (column, rows), (column, None))
    assert present.tolist() == whole_present[rows].tolist()
    assert hi.tolist() == whole_hi[rows].tolist() and lo.tolist() == whole_lo[rows].tolist()


def test_int_attribute_reads_integers_only():
    values = [
        '{"step_id": 5, "x":1}',
        None,
        '{"a":{"q":"\\"step_id\\":3"}}',
        '{"x":2,"step_id":-7}',
        '{"step_id" :  123456789012}',
        '{"step_id":"7"}',
        '{"step_id":}',
        '{"cached":1}',
        '{"step_id":1.5}',
        '{"step_id":2e3}',
        '{"step_id":999999999999999999}',
    ]
    got = int_attribute(pa.array(values), np.arange(len(values)), "step_id")
    # 2e3 is the integer 2000 written as a double (as OTLP's doubleValue may send it)
    assert got.tolist() == [5, -1, -1, -7, 123456789012, -1, -1, -1, -1, 2000, 999999999999999999]


@given(st.lists(st.one_of(st.none(), st.integers(-(10**17), 10**17)), max_size=30))
def test_int_attribute_round_trips_json(values):
    texts = [
        json.dumps({"a": "x", "cached_tokens": v} if v is not None else {"a": 1}) for v in values
    ]
    got = int_attribute(pa.array(texts), np.arange(len(texts)), "cached_tokens")
    assert got.tolist() == [-1 if v is None else v for v in values]


def test_int_attribute_takes_a_later_occurrence_when_the_first_does_not_parse():
    texts = ['{"k":"x","k":4}', '{"a":"k","k": 12}', '"k""k":3', '"k":' + " " * 50 + "8"]
    got = int_attribute(pa.array(texts), np.arange(4), "k")
    assert got.tolist() == [4, 12, -1, -1]  # text that is no JSON object holds no key


def test_int_attribute_reads_integers_sent_as_doubles():
    texts = ['{"k":3.0}', '{"k":3.50}', '{"k":-2.000,"x":1}', '{"k":1e3}', '{"k":true}']
    assert int_attribute(pa.array(texts), np.arange(5), "k").tolist() == [3, -1, -2, 1000, -1]


def test_int_attribute_reads_the_top_level_key_only():
    texts = ['{"prev": {"step_id": 6}, "step_id": 7}', '{"hist":[{"step_id":5}]}',
             '{"step\\u005fid": 7}', '{"a": "{", "step_id": 7}', '  {"step_id":12}',
             '{"a": {"b": 1}, "c": [{"step_id": 2}], "step_id": 3}', '{"note":"caf\\u00e9"}',
             '{"step_id": 4, "later": {"step_id": 8}}']
    got = int_attribute(pa.array(texts), np.arange(len(texts)), "step_id")
    assert got.tolist() == [7, -1, 7, 7, 12, 3, -1, 4]


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**19), 10**19), st.floats(),
              st.text(alphabet='ak{}":\\é_ ', max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["k", "a", "{", '"k"']), inner,
                                            max_size=3)),
    max_leaves=8,
)


@given(st.lists(st.tuples(st.dictionaries(st.sampled_from(["k", "a", "b{", 'x"k":']),
                                          _json_values, max_size=4),
                          st.booleans(), st.booleans()), max_size=20))
def test_int_attribute_equals_a_json_parse(objects):
    """Against ``json.loads``: the top-level ``k`` when it is an integer (or a double with
    no fraction) below 10^18 in magnitude (not a bool), else -1; whatever the nesting,
    escapes and spacing."""
    texts, want = [], []
    for obj, ascii_only, spaced in objects:
        texts.append(json.dumps(obj, ensure_ascii=ascii_only,
                                separators=(", ", ": ") if spaced else (",", ":")))
        v = obj.get("k")
        if isinstance(v, float) and v.is_integer():
            v = int(v)  # an integer sent as a double
        ok = isinstance(v, int) and not isinstance(v, bool) and abs(v) < 10**18
        want.append(v if ok else -1)
    got = int_attribute(pa.array(texts, pa.string()), np.arange(len(texts)), "k")
    assert got.tolist() == want


def test_int_attribute_of_rows_in_several_chunks():
    chunks = pa.chunked_array([['{"k":1}', "{}"], ['{"k": 22}', None, '{"k":-3}']])
    assert int_attribute(chunks, np.array([0, 2, 3, 4]), "k").tolist() == [1, 22, -1, -3]


@given(st.lists(st.integers(0, 5), max_size=50))
def test_group_order_is_a_stable_sort(labels):
    labels = np.array(labels, dtype=np.int64)
    order = group_order(labels, 6)
    assert np.array_equal(order, np.argsort(labels, kind="stable"))


def _hashed(values: list[str | None]) -> tuple[list[int], list[str]]:
    enc = pc.dictionary_encode(pa.array(values, pa.string()))
    return pc.fill_null(enc.indices, -1).to_pylist(), enc.dictionary.to_pylist()


# Runs of one value (a trace's rows), 32- or 16-byte ids and other strings, nulls, split
# into chunks anywhere: codes read by runs and folded words equal hashing every row.
_VALUE = st.one_of(
    st.none(),
    st.sampled_from(["a" * 32, "b" * 32, "0123456789abcdef" * 2, "x" * 16, "short", "", "é" * 16]),
)


@given(st.lists(st.tuples(_VALUE, st.integers(1, 12)), max_size=30), st.integers(1, 50))
def test_codes_by_runs_equal_hashing_every_row(runs, chunk):
    values = [v for v, times in runs for _ in range(times)]
    pieces = [values[i : i + chunk] for i in range(0, len(values), chunk)]
    column = pa.chunked_array([pa.array(p, pa.string()) for p in pieces], pa.string())
    got, distinct = codes(column, runs=True)
    want, want_distinct = _hashed(values)
    assert got.tolist() == want and distinct == want_distinct


def test_fixed_width_ids_in_long_runs_are_read_by_their_words():
    ids = [f"{i:032x}" for i in (5, 3, 5, 9)]
    values = [v for v in ids for _ in range(10)]
    got, distinct = codes(pa.chunked_array([pa.array(values[:17]), pa.array(values[17:])]),
                          runs=True)
    assert distinct == [ids[0], ids[1], ids[3]]
    assert got.tolist() == [0] * 10 + [1] * 10 + [0] * 10 + [2] * 10


@given(st.lists(st.one_of(st.none(), st.sampled_from(["00000000000000ff", "a000000000000000",
                                                       "ffffffffffffffff"])), max_size=40),
       st.integers(1, 9), st.booleans())
def test_span_ids_by_chunks_equal_the_whole_column(ids, chunk, odd):
    if odd:
        ids = [*ids, "not-sixteen"]
    pieces = [ids[i : i + chunk] for i in range(0, len(ids), chunk)] or [[]]
    column = pa.chunked_array([pa.array(p, pa.string()) for p in pieces], pa.string())
    hi, lo, present = id_values(column)
    assert present.tolist() == [i is not None for i in ids]
    keys = [(int(h), int(x)) for h, x in zip(hi, lo, strict=True)]
    real = [i for i in range(len(ids)) if ids[i] is not None]
    # Equal ids get equal words, and words order the ids as the strings do.
    assert sorted(real, key=lambda i: (keys[i], i)) == sorted(real, key=lambda i: (ids[i], i))
    assert all(keys[i] == (0, 0) for i in range(len(ids)) if ids[i] is None)


@given(st.lists(st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)), max_size=5),
                min_size=1, max_size=5))
def test_int64_of_several_chunks_is_an_owned_copy_with_nulls_filled(chunks):
    column = pa.chunked_array([pa.array(c, pa.int64()) for c in chunks], pa.int64())
    got = int64(column, fill=-7)
    assert got.dtype == np.int64
    assert got.tolist() == [-7 if v is None else v for c in chunks for v in c]
    if column.num_chunks > 1:
        assert got.flags.writeable and got.flags.owndata


def test_narrow_keeps_every_code_and_null():
    codes_ = np.array([-1, 0, 5, 32_766], np.int32)
    assert narrow(codes_, 32_767).dtype == np.int16
    assert narrow(codes_, 32_767).tolist() == codes_.tolist()
    assert narrow(codes_, 2**15) is codes_  # too many values: left as they are
