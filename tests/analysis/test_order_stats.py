"""Exact percentiles over parts (analysis.order_stats): numpy's, bit for bit, however the
values are split and however few may be fetched at once."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ttft.analysis import order_stats, part_sets
from ttft.analysis.order_stats import (
    InMemory,
    Named,
    Spilled,
    exact_sum,
    medians,
    percentiles,
    remembered,
)


class Tight(InMemory):
    """Parts in memory that fetch at most a few values per rank: every pass refines."""

    def __init__(self, parts, limit):
        super().__init__(parts)
        self.fetch_limit = limit
        self.passes = 0

    def map(self, fn):
        self.passes += 1
        return super().map(fn)


def split(values: np.ndarray, cuts: list[int]) -> list[np.ndarray]:
    return np.split(values, sorted({min(c, len(values)) for c in cuts}))


ints = st.lists(st.one_of(st.integers(-3, 3), st.integers(-(2**62), 2**62),
                          st.integers(0, 10**10)), min_size=0, max_size=300)
# Latencies are far from overflow (a mean of two values near 1.8e308 is not);
# -0.0 and 0.0 are equal to numpy's partition, which returns either: not compared here
floats = st.lists(st.one_of(st.floats(-1e300, 1e300),
                            st.sampled_from([0.0, 1.5, 1e-300, 5e-324])).map(lambda x: x + 0.0),
                  min_size=0, max_size=300)
qs = st.lists(st.floats(0, 100), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.one_of(ints.map(lambda v: np.asarray(v, np.int64)),
                 floats.map(lambda v: np.asarray(v, np.float64))),
       st.lists(st.integers(0, 300), max_size=5), qs, st.integers(1, 8))
def test_percentiles_are_numpy_s_however_split(values, cuts, q, limit):
    parts = split(values, cuts)
    columns = [lambda p: p, lambda p: p[::2]]
    for where in (InMemory(parts), Tight(parts, limit)):
        found = percentiles(where, columns, q)
        for column, got in zip(columns, found, strict=True):
            whole = np.concatenate([column(p) for p in parts])
            if len(whole) == 0:
                assert got is None
                continue
            want = np.percentile(whole, q)
            assert got.tobytes() == want.tobytes(), (whole, q, got, want)
            assert got.dtype == want.dtype


@settings(max_examples=200, deadline=None)
@given(st.one_of(ints.map(lambda v: np.asarray(v, np.int64)),
                 floats.map(lambda v: np.asarray(v, np.float64))),
       st.lists(st.integers(0, 300), max_size=5), st.integers(1, 8))
def test_medians_are_numpy_s(values, cuts, limit):
    parts = split(values, cuts)
    (got,) = medians(Tight(parts, limit), [lambda p: p])
    if len(values) == 0:
        assert got is None
    else:
        assert np.float64(got).tobytes() == np.float64(np.median(values)).tobytes()


def test_nan_makes_every_figure_nan_as_numpy():
    parts = [np.array([1.0, np.nan]), np.array([2.0])]
    (got,) = percentiles(InMemory(parts), [lambda p: p], [10, 50])
    assert np.isnan(got).all() and np.isnan(np.percentile(np.concatenate(parts), [10, 50])).all()


def test_refinement_takes_few_passes_whatever_the_spread():
    rng = np.random.default_rng(0)
    heavy = np.exp(rng.normal(0, 6, 200_000))  # 12 decades of latencies
    ties = np.repeat([5, 7, 7, 2**60], 50_000).astype(np.int64)
    for values in (heavy, ties, heavy.astype(np.int64)):
        parts = Tight(np.array_split(values, 7), 1000)
        (got,) = percentiles(parts, [lambda p: p], [50, 90, 99, 99.9])
        assert got.tobytes() == np.percentile(values, [50, 90, 99, 99.9]).tobytes()
        assert parts.passes <= 8, parts.passes


def test_parts_held_whole_take_one_pass_a_batch_and_give_numpy_s():
    """No fetch limit (every value held anyway): each batch of `HELD_BATCH` columns reads every
    part once, values fetched with the bounds; ties, one value, floats and ints alike."""
    rng = np.random.default_rng(1)
    columns = [np.exp(rng.normal(0, 6, 5_000)), np.full(300, 7, np.int64),
               rng.integers(-10, 10, 4_000), np.asarray([2.5])]
    batches = 2
    wanted = [columns[c % len(columns)] for c in range(order_stats.HELD_BATCH * batches)]
    parts = Tight([[np.array_split(v, 5)[k] for v in wanted] for k in range(5)], None)
    got = percentiles(parts, [(lambda p, c=c: p[c]) for c in range(len(wanted))], [0, 37, 99])
    assert parts.passes == batches
    for values, found in zip(wanted, got, strict=True):
        assert found.tobytes() == np.percentile(values, [0, 37, 99]).tobytes()
    mixed = Tight([np.asarray([1.0]), np.asarray([2], np.int64)], None)
    with pytest.raises(ValueError, match="floats in some parts and integers in others"):
        percentiles(mixed, [lambda p: p], [50])


def test_remembered_columns_are_found_together_and_asked_again_without_a_pass():
    """``remembered``: the asked (column, percentiles) pairs are found in one set of
    passes, numpy's bit for bit; asking again inside takes no pass, other percentiles of
    the same column or an unnamed column do, and nothing is kept after the context."""
    rng = np.random.default_rng(4)
    values = np.exp(rng.normal(0, 4, 30_000))
    parts = Tight(np.array_split(values, 6), 500)
    a, b = Named(("a",), lambda p: p), Named(("b",), lambda p: p * 2.0)
    with remembered(parts, [(a, [50, 99]), (b, [10])]):
        found = parts.passes
        assert found <= 5
        (got_a,), (got_b,) = percentiles(parts, [a], [50, 99]), percentiles(parts, [b], [10])
        assert parts.passes == found
        assert got_a.tobytes() == np.percentile(values, [50, 99]).tobytes()
        assert got_b.tobytes() == np.percentile(values * 2.0, [10]).tobytes()
        (other,) = percentiles(parts, [a], [10])
        assert parts.passes > found and other.tobytes() == np.percentile(values, [10]).tobytes()
        again = parts.passes
        percentiles(parts, [lambda p: p], [50, 99])
        assert parts.passes > again
    left = parts.passes
    percentiles(parts, [a], [50, 99])
    assert parts.passes > left


def test_a_spilled_set_holds_its_parts_on_disk_and_gives_the_same(tmp_path):
    rng = np.random.default_rng(1)
    values = rng.integers(0, 10**9, 50_000)
    with Spilled(str(tmp_path), keep_bytes=0) as parts:
        for piece in np.array_split(values, 5):
            parts.add(piece)
        assert len([p for d in tmp_path.iterdir() for p in d.iterdir()]) == 5
        (got,) = percentiles(parts, [lambda p: p], [50, 99])
        assert got.tobytes() == np.percentile(values, [50, 99]).tobytes()
    assert not any(tmp_path.iterdir())


def test_a_spilled_set_keeps_the_parts_its_budget_holds_and_reads_the_rest_each_pass(
        tmp_path):
    """With room for 2 of 5 parts, the first pass reads all 5 and keeps the first 2; each
    later pass reads the other 3 again (refining: the limit stands); with room for all,
    later passes read nothing and fetch at once. Both give numpy's figures."""
    values = np.random.default_rng(2).integers(0, 10**9, 50_000)
    pieces = np.array_split(values, 5)
    np.save(tmp_path / "probe.npy", pieces[0])  # a part's file, as Spilled writes it
    size = os.path.getsize(tmp_path / "probe.npy")
    os.remove(tmp_path / "probe.npy")
    for keep, later, limit in ((2 * size + size // 2, 3, order_stats.FETCH_LIMIT),
                               (10 * size, 0, None)):
        loads = []

        def load(directory, loads=loads):
            loads.append(directory)
            return part_sets._load_array(directory)

        with Spilled(str(tmp_path), load=load, keep_bytes=keep) as parts:
            for piece in pieces:
                parts.add(piece)
            parts.fetch_limit = 100  # refine pass by pass while parts are read from disk
            parts.map(len)
            assert len(loads) == 5
            parts.map(len)
            assert len(loads) == 5 + later
            assert parts.fetch_limit == (100 if limit else None)
            (got,) = percentiles(parts, [lambda p: p], [50, 99])
            assert got.tobytes() == np.percentile(values, [50, 99]).tobytes()
            parts.put(0, pieces[0])  # replaced: read again
            before = len(loads)
            parts.map(len)
            assert len(loads) - before == later + 1


def test_a_spilled_set_with_sizes_keeps_in_memory_what_fits_and_writes_the_rest(tmp_path):
    """Sized parts are kept as they are put while the budget holds them (never written),
    the rest written and read at each pass; a part put again replaces its kept copy."""
    values = np.random.default_rng(3).integers(0, 10**9, 50_000)
    pieces = np.array_split(values, 5)
    loads = []

    def load(directory):
        loads.append(directory)
        return part_sets._load_array(directory)

    with Spilled(str(tmp_path), load=load, keep_bytes=2 * pieces[0].nbytes,
                 size=lambda a: a.nbytes) as parts:
        for piece in pieces:
            parts.add(piece)
        (folder,) = tmp_path.iterdir()
        assert len(parts) == 5 and len(list(folder.iterdir())) == 3  # 2 kept, 3 written
        parts.fetch_limit = 100
        (got,) = percentiles(parts, [lambda p: p], [50, 99])
        assert got.tobytes() == np.percentile(values, [50, 99]).tobytes()
        assert len(loads) % 3 == 0 and len(loads) > 3  # the 3 written, at every pass
        assert parts.map(len) == [len(p) for p in pieces]
        parts.put(4, pieces[4][:10])  # the last part, shorter now
        assert parts.map(len)[4] == 10 and len(parts) == 5


@settings(max_examples=200, deadline=None)
@given(floats, st.lists(st.integers(0, 300), max_size=4))
def test_exact_sums_of_parts_add_up_to_fsum(values, cuts):
    parts = split(np.asarray(values, np.float64), cuts)
    total = sum((exact_sum(p) for p in parts), exact_sum(np.empty(0)))
    assert float(total) == math.fsum(values)


@pytest.mark.parametrize(("lo", "hi"), [(0, 10), (-5, 2**62), (7, 7 + order_stats.BINS * 3),
                                       (-(2**63), 2**63 - 1), (5, 5 + order_stats.BINS - 1),
                                       (5, 5 + order_stats.BINS)])
def test_bins_split_a_range_into_at_most_bins_in_key_order(lo, hi):
    """Every key of ``lo..hi`` falls in a bin below `BINS`, bins in key order, the first
    key in bin 0 and each bin ``lo + (b << shift)`` on."""
    shift = order_stats._bin_shift(lo, hi)
    inside = np.unique(np.asarray([lo, hi, lo + 1, hi - 1, (lo + hi) // 2, lo + (1 << shift),
                                   lo + (1 << shift) - 1], np.int64).clip(lo, hi))
    bins = order_stats._bins(inside, lo, shift)
    assert bins[0] == 0 and bins.max() < order_stats.BINS
    assert (np.diff(bins) >= 0).all()
    for key, b in zip(inside.tolist(), bins.tolist(), strict=True):
        assert lo + (b << shift) <= key < lo + ((b + 1) << shift)


@pytest.mark.parametrize("mutant", ["lerp", "rank"])
def test_a_wrong_interpolation_is_caught(monkeypatch, mutant):
    values = np.asarray([2.2715759353337974, 3.2186939107594217, 3.3791122550713326,
                         3.9161900052816123, 5.715298307297609, 5.9430003019969675,
                         8.902743520047924])
    if mutant == "lerp":  # numpy interpolates from the nearer neighbour
        monkeypatch.setattr(order_stats, "_lerp", lambda a, b, t: a + (b - a) * t)
        q = [62.31871446860424]
    else:
        real = order_stats._ranks
        monkeypatch.setattr(order_stats, "_ranks",
                            lambda n, q: tuple(np.minimum(x + 1, n - 1) if i < 2 else x
                                               for i, x in enumerate(real(n, q))))
        q = [50]
    (got,) = percentiles(InMemory([values]), [lambda p: p], q)
    assert got.tobytes() != np.percentile(values, q).tobytes()
