"""The compiled kernels (``analysis._kernels``) against the vectorized steps they stand in
for on large tables: the same answers on the same input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from _build import event, row, table
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ttft.analysis import _column_arrays, _step_join
from ttft.analysis._column_arrays import int_attribute
from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.collectors.synthetic import generate
from ttft.tracer.schema import BOUNDARY_NAMES, POLICIES


def _both(texts, rows, key, monkeypatch) -> tuple[list[int], list[int]]:
    """``int_attribute`` by the expressions (below `KERNEL_ROWS`, and numba's being loaded
    not counted) and by the scan (the threshold lowered to 1)."""
    arr = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(texts, pa.string())
    with monkeypatch.context() as m:
        m.setattr(_column_arrays, "LOADED_KERNEL_ROWS", 2**62)
        by_regex = int_attribute(arr, rows, key).tolist()
    with monkeypatch.context() as m:
        m.setattr(_column_arrays, "KERNEL_ROWS", 1)
        by_scan = int_attribute(arr, rows, key).tolist()
    return by_regex, by_scan


_pieces = st.sampled_from(['"k":', '"k": ', '"k"', "{", "{", "}", ":", " ", "\t", ",", '"',
                           "\\", "-", ".", "0", "7", "123", "e", "E", "[", "]", '"a":', "9" * 19,
                           "é"])
"""Pieces that often make a key, a colon and a number, in and out of objects."""


@settings(max_examples=400)
@example(['"k":1', '{{"k":1', ' {"k":-0}', '{"k":3.00e', '{"a":{"k":2},"k":5}', '{"k":1.}',
          '{"k":' + '9' * 19 + '}', '{"k": ' + '9' * 18 + '}'])
@given(st.lists(st.one_of(st.none(), st.lists(_pieces, max_size=12).map("".join)),
                max_size=12))
def test_int_scan_reads_any_text_as_the_expressions_do(texts):
    with pytest.MonkeyPatch.context() as monkeypatch:
        by_regex, by_scan = _both(texts, np.arange(len(texts)), "k", monkeypatch)
    assert by_scan == by_regex


@given(st.lists(st.one_of(st.none(), st.integers(0, 99).map(lambda v: f'{{"k": {v}}}')),
                min_size=1, max_size=20), st.data())
def test_int_scan_reads_slices_and_dictionary_columns_at_their_rows(texts, data):
    cut = data.draw(st.integers(0, len(texts) - 1))
    rows = np.array(sorted(data.draw(st.sets(st.integers(0, len(texts) - cut - 1)))), np.int64)
    want = [json.loads(t)["k"] if t else -1 for t in texts[cut:]]
    sliced = pa.array(texts, pa.string()).slice(cut)  # an Arrow offset inside the buffers
    encoded = pa.chunked_array([pa.array(texts[cut:], pa.string()).dictionary_encode()])
    with pytest.MonkeyPatch.context() as monkeypatch:
        for arr in (sliced, encoded):
            assert _both(arr, rows, "k", monkeypatch) == ([want[r] for r in rows],) * 2


def _long_and_tied_requests() -> list[dict]:
    """Two requests the sweep leaves to the blocks: one of 70 spans (more than
    `MAX_SWEEP`), and one whose client and server traces (one request id) hold one span id
    at one start, stage and depth, which only the trace ids order."""
    client = {"clock": "client", "service": "loadgen"}
    rows = [row(1, 1, "client", 0, 1000, **client), event(1, 2, "first_token", 900, **client),
            row(1, 3, "server", 10, 990, parent=1), event(1, 4, "first_byte", 880, parent=3)]
    rows += [row(1, 10 + i, "forward", 20 + 10 * i, 40 + 10 * i, parent=3) for i in range(66)]
    rows += [row(2, 1, "client", 0, 500, request_id="r", **client),
             event(2, 2, "first_token", 400, request_id="r", **client),
             row(3, 3, "server", 10, 490, request_id="r"),
             event(3, 4, "first_byte", 380, request_id="r"),
             row(2, 7, "queue", 100, 300, parent=1, request_id="r"),
             row(3, 7, "queue", 100, 200, parent=3, request_id="r")]
    return rows


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("boundary", BOUNDARY_NAMES)
def test_compiled_sweeps_equal_the_blocks(boundary, policy):
    """The compiled sweeps (``_kernels.exclusive_sweep``, ``_policy_kernels.policy_sweep``)
    against the blocks on a synthetic workload (with gpu copies and several chunks per
    request) and on the requests they leave to the blocks."""
    synthetic = generate(400, seed=3).table
    for tbl in (synthetic, pa.concat_tables([synthetic, table(_long_and_tied_requests())])):
        with pytest.MonkeyPatch.context() as patch:  # blocks, numba loaded or not
            patch.setattr(_column_arrays, "LOADED_KERNEL_ROWS", 2**62)
            asm = assemble(tbl)
            want = attribute(asm, boundary, policy)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_column_arrays, "KERNEL_ROWS", 1)
            got = attribute(asm, boundary, policy)
        pd.testing.assert_frame_equal(got.requests, want.requests)
        for part in ("attributed", "covered", "raw"):
            pd.testing.assert_frame_equal(getattr(got, part), getattr(want, part))
        assert (got.attributed.sum(axis=1) == got.requests.ttft_ns).all()


_words = st.integers(0, 3) | st.just(2**64 - 1)
"""Key parts from a few values (so keys repeat and collide) and the largest uint64."""
_keys = st.lists(st.tuples(_words, _words, _words), max_size=60)


@settings(max_examples=300)
@given(_keys, _keys)
def test_first_of_keys_finds_what_the_merge_finds(keys, wanted):
    """The compiled hash join of the step join's launches against the pandas merge it
    stands in for: for each wanted key, the first index holding it, or -1."""
    def columns(rows):
        return tuple(np.array([r[i] for r in rows], np.uint64) for i in range(3))

    want = _step_join.first_merged(columns(keys), columns(wanted))
    got = _step_join._first_hashed(columns(keys), columns(wanted))
    assert got.tolist() == want.tolist()
    assert want.tolist() == [keys.index(w) if w in keys else -1 for w in wanted]

