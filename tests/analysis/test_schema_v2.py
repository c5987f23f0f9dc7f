"""The analysis of a table with its ids as bytes (schema version 2) is the analysis of the
same table with them as text (version 1): every figure, every defect and its examples, for
every policy, on synthetic traces and on the corrupted tables of
``test_corrupted_traces`` (whose odd ids keep some of them in version 1)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_corrupted_traces import _table, apply, corrupted

from ttft.analysis import _column_arrays as col
from ttft.analysis import analyze
from ttft.analysis._id_words import id_words
from ttft.collectors.synthetic import generate
from ttft.tracer.span_ids import to_v2

POLICIES = ("exclusive", "shared", "critical-path")


def _figures(table: pa.Table, policy: str) -> dict:
    analysis = analyze(table, policy=policy)
    attr = analysis.attribution
    return {"summary": json.dumps(analysis.summary.to_dict(), sort_keys=True, default=str),
            "requests": attr.requests.to_dict("list"),
            "attributed": attr.attributed.to_dict("list"),
            "quality": (attr.quality.counts, attr.quality.examples)}


def _same_answers(table: pa.Table) -> bool:
    """Whether ``table`` converts; asserts both layouts give every figure alike."""
    stored = to_v2(table)
    if stored is None:
        return False
    for policy in POLICIES:
        assert _figures(stored, policy) == _figures(table, policy), policy
    return True


@pytest.mark.parametrize("seed", [1, 4])
def test_synthetic_traces_give_one_answer_in_both_layouts(seed):
    table = generate(120, seed=seed).table
    rng = np.random.default_rng(seed)
    shuffled = table.take(rng.permutation(table.num_rows))  # traces not held together
    chunked = pa.concat_tables([table.slice(i, 517) for i in range(0, table.num_rows, 517)])
    for t in (table, shuffled, chunked):
        assert _same_answers(t)


def test_large_traces_give_one_answer_with_the_compiled_kernels(monkeypatch):
    monkeypatch.setattr(col, "KERNEL_ROWS", 1)
    assert _same_answers(generate(60, seed=9).table)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(corrupted)
def test_corrupted_tables_give_one_answer_in_both_layouts(recipe):
    rows, _ = apply(recipe)
    _same_answers(_table(rows))


_id = st.one_of(st.none(), st.just(""), st.sampled_from(["00" * 8, "0f" * 8, "ff" * 8,
                                                          "a0" * 8, "0a" * 8]))


@given(st.lists(st.tuples(st.sampled_from(["ab" * 16, "0c" * 16, "ff" * 16]), _id, _id),
                min_size=1, max_size=60), st.integers(1, 9), st.data())
def test_trace_codes_and_id_words_are_those_of_the_text(rows, chunk, data):
    n = len(rows)
    cols = {name: [r[i] for r in rows] for i, name in enumerate(("trace_id", "span_id",
                                                                  "parent_id"))}
    base = generate(1, seed=0).table.slice(0, 1)
    table = pa.table({**{c: pa.array(v, pa.string()) for c, v in cols.items()},
                      **{c: pa.array([base.column(c)[0].as_py()] * n, base.schema.field(c).type)
                         for c in base.column_names if c not in cols}}).select(base.column_names)
    table = pa.concat_tables([table.slice(i, chunk) for i in range(0, n, chunk)])
    stored = to_v2(table)
    assert stored is not None
    got = col.trace_codes(stored.column("trace_id"))
    want = col.trace_codes(table.column("trace_id"))
    assert got[0].tolist() == want[0].tolist() and got[1] == want[1]
    picks = data.draw(st.lists(st.integers(0, n - 1), max_size=2 * n))
    rows_ = np.asarray(picks, np.int64)
    want_words = id_words((table.column("span_id"), rows_), (table.column("parent_id"), None))
    for kernel_rows in (col.KERNEL_ROWS, 1):  # numpy's gathers, then the compiled pass
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(col, "KERNEL_ROWS", kernel_rows)
            got_words = id_words((stored.column("span_id"), rows_),
                                 (stored.column("parent_id"), None))
        for a, b in zip(got_words, want_words, strict=True):
            assert [x.tolist() for x in a] == [x.tolist() for x in b], kernel_rows


@settings(max_examples=30, deadline=None)
@given(st.binary(min_size=0, max_size=8 * 40), st.data())
def test_the_compiled_hex_words_are_numpy_s(raw, data):
    """``_kernels.hex_id_words`` gives ``span_ids.hex_words`` of every valid row picked,
    in any order, and zeros for a null."""
    from ttft.analysis._kernels import hex_id_words
    from ttft.tracer.span_ids import hex_words

    ids = np.frombuffer(raw[: len(raw) // 8 * 8], np.uint8).reshape(-1, 8)
    n = len(ids)
    valid = np.asarray(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    rows = np.asarray(data.draw(st.lists(st.integers(0, max(n - 1, 0)),
                                         max_size=2 * n if n else 0)), np.int64)
    high, low = np.ones(len(rows), np.uint64), np.ones(len(rows), np.uint64)
    ok = np.zeros(len(rows), bool)
    hex_id_words(ids, valid, rows, high, low, ok)
    want = hex_words(ids[rows]) if len(rows) else np.zeros((0, 2), np.uint64)
    assert ok.tolist() == valid[rows].tolist()
    assert high.tolist() == np.where(ok, want[:, 0], 0).tolist()
    assert low.tolist() == np.where(ok, want[:, 1], 0).tolist()


def test_a_dictionary_that_names_a_trace_twice_is_one_trace():
    """A version-1 table whose trace ids are a dictionary holding one id twice groups
    its rows as plain text does (and as the bytes do)."""
    table = generate(30, seed=3).table
    ids = table.column("trace_id").combine_chunks()
    enc = pc.dictionary_encode(ids)
    twice = pa.concat_arrays([enc.dictionary, enc.dictionary.slice(0, 1)])
    # the first row keeps code 0; every later row of that trace takes the second copy
    codes = np.array(enc.indices.to_numpy(), np.int32)
    later = np.flatnonzero(codes == 0)[1:]
    codes[later] = len(enc.dictionary)
    indices = pa.array(codes, pa.int32())
    dictionary = pa.DictionaryArray.from_arrays(indices, twice)
    as_dictionary = table.set_column(0, "trace_id", dictionary)
    for policy in POLICIES:
        assert _figures(as_dictionary, policy) == _figures(table, policy)
