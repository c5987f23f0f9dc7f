"""Column conversions: span ids, integer attributes, grouping."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from ttft.analysis._columns import group_order, id_values, int_attribute


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
    assert got.tolist() == [5, -1, -1, -7, 123456789012, -1, -1, -1, -1, -1, 999999999999999999]


@given(st.lists(st.one_of(st.none(), st.integers(-(10**17), 10**17)), max_size=30))
def test_int_attribute_round_trips_json(values):
    texts = [
        json.dumps({"a": "x", "cached_tokens": v} if v is not None else {"a": 1}) for v in values
    ]
    got = int_attribute(pa.array(texts), np.arange(len(texts)), "cached_tokens")
    assert got.tolist() == [-1 if v is None else v for v in values]


@given(st.lists(st.integers(0, 5), max_size=50))
def test_group_order_is_a_stable_sort(labels):
    labels = np.array(labels, dtype=np.int64)
    order = group_order(labels, 6)
    assert np.array_equal(order, np.argsort(labels, kind="stable"))
