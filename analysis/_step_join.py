"""The step join: which engine-trace ``gpu`` spans each request ``prefill.chunk`` launched,
by ``(service, step_id)`` (docs/attribution.md, "Attribution rules": step-id join).

A step id names one step only within one *step instance*: on each clock of an engine trace,
the gpu spans in start order fall into runs of one step id, and the k-th run of an id on a
clock is occurrence k (runs of one occurrence on several clocks, one per device, are one
instance). An engine that restarts its counter, replicas that share a service name, or an
engine that numbers steps per batch give one id several instances. A chunk whose key has
more than one instance is a ``reused_step_id`` defect and joins the one instance holding
the gpu span that starts nearest its own start (ties: the smaller trace id, then the
earlier occurrence), never the others: no request is given another step's gpu time.

Within its instance a chunk joins the gpu spans it launched: those whose launch (the start
of the forward that launched them, their parent, else their own start) lies in its span.
A gpu span no chunk launched (one forward for the whole batch, launched before or after
the chunks' spans) joins every chunk of its instance. Every step is a hash, a sort, a merge or a
binary search, so the join is linear in rows (with a log factor) whatever the ids, and a
chunk's copies are the spans it launched, or its batch's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from ttft.analysis import _column_arrays as col
from ttft.analysis._grouping import StepKeys, step_keys
from ttft.analysis._id_words import id_words
from ttft.analysis._trees import value_rank

__all__ = ["join_gpu"]


def join_gpu(
    table: pa.Table,
    stage: np.ndarray,
    row_req: np.ndarray,
    valid: np.ndarray,
    span_rows: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    trace: np.ndarray,
    trace_values: list[str],
    clock: np.ndarray,
    shift: np.ndarray | None = None,
    untraced: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs ``(chunk row, gpu row)``: each request chunk and the gpu spans of the step
    instance it joins (module docstring), and the chunk rows whose key has several
    instances. ``start`` is shifted by ``shift``; a gpu row ``untraced`` moves with the
    chunk, as its copy does, so its distance is measured before the shift."""
    empty = np.empty(0, np.int64)
    keys = step_keys(table, stage, row_req, valid, span_rows)
    if keys is None:
        return empty, empty, empty
    key_g, key_c, key_s = _key_codes(keys)
    occurrence = _run_occurrence(keys, key_g, trace, clock, start)
    by_step = _step_occurrence(keys, key_g, key_s, trace, start)
    occurrence = np.where(by_step >= 0, by_step, occurrence)
    instance = _codes(key_g, trace[keys.gpus], occurrence)
    rank = value_rank(trace[keys.gpus], trace_values)
    if untraced is None or shift is None:
        moved = np.zeros(len(keys.gpus), bool)
        g_at, c_at, c_raw = start[keys.gpus], start[keys.chunks], start[keys.chunks]
    else:
        moved = untraced[keys.gpus]
        g_at = np.where(moved, start[keys.gpus] - shift[keys.gpus], start[keys.gpus])
        c_at, c_raw = start[keys.chunks], start[keys.chunks] - shift[keys.chunks]
    best, distance = _nearest_of(~moved, key_g, g_at, rank, occurrence, key_c, c_at)
    if moved.any():
        other, d_other = _nearest_of(moved, key_g, g_at, rank, occurrence, key_c, c_raw)
        take = (other >= 0) & ((best < 0) | (d_other < distance) | (
            (d_other == distance) & _before(other, best, rank, occurrence)))
        best = np.where(take, other, best)
    joined = best >= 0
    chunks = keys.chunks[joined].astype(np.int64)
    chosen = instance[best[joined]]
    launch = _launches(table, keys.gpus, trace, start, row_req, valid)
    left, right = _pairs(chunks, chosen, start[chunks], end[chunks], instance, launch, ~moved)
    key_of = np.empty(int(instance.max()) + 1, np.int64)
    key_of[instance] = key_g  # an instance is of one key
    per_key = np.bincount(key_of, minlength=int(key_g.max()) + 1)
    reused = chunks[per_key[key_c[joined]] > 1]
    order = np.lexsort((keys.gpus[right], left))
    return left[order], keys.gpus[right[order]].astype(np.int64), reused


def _launches(table: pa.Table, gpus: np.ndarray, trace: np.ndarray, start: np.ndarray,
              row_req: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Each gpu row's launch: the start of its parent (the forward that launched it) when
    that is a span of its own engine trace starting no later than it, else its own start
    (work on a device starts after its launch, maybe long after: queued behind the
    step's earlier work). Of several engine spans with the parent's trace and id, the
    first in the table is the parent."""
    launch = start[gpus].copy()
    engine = np.flatnonzero(valid & (row_req < 0))
    (ph, pl, pp), (sh, sl, sp) = id_words((table.column("parent_id"), gpus),
                                          (table.column("span_id"), engine))
    if not pp.any() or not sp.any():
        return launch
    named = engine[sp]  # the engine spans that have an id
    keys = (trace[named], sh[sp], sl[sp])
    wanted = (trace[gpus[pp]], ph[pp], pl[pp])
    first = (_first_hashed if col.compiled(len(engine)) else first_merged)(keys, wanted)
    found = first >= 0
    g, parent = np.flatnonzero(pp)[found], named[first[found]]
    ok = start[parent] <= launch[g]
    launch[g[ok]] = start[parent[ok]]
    return launch


Keys = tuple[np.ndarray, np.ndarray, np.ndarray]


def first_merged(keys: Keys, wanted: Keys) -> np.ndarray:
    """For each wanted ``(trace, high, low)``, the index of the first of ``keys`` equal to
    it, -1 where none: by a pandas merge on the keys made distinct (the reference of
    `_first_hashed`, and the way for small tables, which never load numba)."""
    spans = pd.DataFrame({"t": keys[0], "h": keys[1], "l": keys[2],
                          "row": np.arange(len(keys[0]))})
    query = pd.DataFrame({"t": wanted[0], "h": wanted[1], "l": wanted[2],
                          "g": np.arange(len(wanted[0]))})
    found = query.merge(spans.drop_duplicates(["t", "h", "l"]), on=["t", "h", "l"])
    out = np.full(len(wanted[0]), -1, np.int64)
    out[found["g"].to_numpy(np.int64)] = found["row"].to_numpy(np.int64)
    return out


def _first_hashed(keys: Keys, wanted: Keys) -> np.ndarray:
    """`first_merged` by one compiled hash table (``_kernels.first_of_keys``)."""
    from ttft.analysis._kernels import first_of_keys  # numba: only large tables need it

    out = np.empty(len(wanted[0]), np.int64)
    first_of_keys(*(np.ascontiguousarray(a).astype(np.uint64, copy=False)
                    for a in (*keys, *wanted)), out)
    return out


def _pairs(chunks: np.ndarray, chosen: np.ndarray, c_start: np.ndarray, c_end: np.ndarray,
           instance: np.ndarray, launch: np.ndarray, narrow: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(chunk row, gpu index)`` pairs: a gpu span (``narrow``: its launch comparable with
    the chunks') joins the chunks of its instance whose span holds its launch (an engine
    that runs a step's chunks one forward each gives each chunk its own); one no chunk
    holds joins every chunk of its instance (one forward for the whole batch)."""
    n = int(instance.max()) + 1
    # Gpu spans by (instance, launch): a chunk's launched ones are one run of them.
    rows = np.flatnonzero(narrow)
    order = rows[np.lexsort((launch[rows], instance[rows]))]
    # (instance, launch) as one int64 that sorts alike: the launch's rank among the
    # distinct launches. A chunk's launches are those ranked from the first launch at or
    # after its start to the last at or before its end.
    times, rank = np.unique(launch[order], return_inverse=True)
    width = np.int64(len(times) + 1)
    sorted_keys = instance[order].astype(np.int64) * width + rank
    at = chosen.astype(np.int64) * width
    lo = np.searchsorted(sorted_keys, at + np.searchsorted(times, c_start, "left"), "left")
    hi = np.maximum(np.searchsorted(sorted_keys, at + np.searchsorted(times, c_end, "right"),
                                    "left"), lo)
    edges = np.zeros(len(order) + 1, np.int64)
    np.add.at(edges, lo, 1)
    np.add.at(edges, hi, -1)
    covered = np.zeros(len(instance), bool)
    covered[order] = np.cumsum(edges)[:-1] > 0
    a_left, a_right = _runs(chunks, lo, hi, order)
    rest = np.flatnonzero(~covered)
    rest = rest[np.argsort(instance[rest], kind="stable")]
    sizes = np.bincount(instance[rest], minlength=n)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    b_left, b_right = _runs(chunks, first[chosen], first[chosen] + sizes[chosen], rest)
    return np.concatenate([a_left, b_left]), np.concatenate([a_right, b_right])


def _runs(chunks: np.ndarray, lo: np.ndarray, hi: np.ndarray, order: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """Each chunk paired with ``order[lo:hi]`` of its own."""
    many = hi - lo
    offsets = np.repeat(lo - np.concatenate([[0], np.cumsum(many)[:-1]]), many)
    return np.repeat(chunks, many), order[offsets + np.arange(int(many.sum()))]


def _key_codes(keys: StepKeys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense codes of ``(service, step_id)`` for the gpu rows, for the chunk rows and for
    the step rows (-1: a key no gpu span has), by hashing, not sorting."""
    n_g, n_c = len(keys.gpus), len(keys.chunks)
    code = _codes(np.concatenate([keys.gpu_service, keys.chunk_service, keys.step_service]),
                  np.concatenate([keys.gpu_step, keys.chunk_step, keys.step_step]))
    # Codes are given in order of first appearance, gpu rows first: theirs are 0..K-1.
    key_g = code[:n_g]
    known = int(key_g.max()) + 1
    other = np.where(code[n_g:] < known, code[n_g:], -1)
    return key_g, other[:n_c], other[n_c:]


def _codes(*columns: np.ndarray) -> np.ndarray:
    """Dense codes of the rows' tuples of ``columns`` (integers of any range), numbered in
    order of first appearance: a hash per column, never a sort or a record compare."""
    code = pd.factorize(columns[0])[0].astype(np.int64)
    for column in columns[1:]:
        values = pd.factorize(column)[0].astype(np.int64)
        width = np.int64(values.max() + 1) if len(values) else np.int64(1)
        code = pd.factorize(code * width + values)[0].astype(np.int64)
    return code


def _run_occurrence(keys: StepKeys, key_g: np.ndarray, trace: np.ndarray, clock: np.ndarray,
                    start: np.ndarray) -> np.ndarray:
    """Each gpu row's occurrence by runs (module docstring)."""
    g = keys.gpus
    t, c, s = trace[g].astype(np.int64), clock[g].astype(np.int64), start[g]
    order = np.lexsort((g, s, c, t))
    t, c, k = t[order], c[order], key_g[order]
    new_run = np.r_[True, (t[1:] != t[:-1]) | (c[1:] != c[:-1]) | (k[1:] != k[:-1])]
    run = np.cumsum(new_run) - 1
    heads = np.flatnonzero(new_run)
    # The occurrence of a run: how many runs of its (trace, clock, key) came before it.
    by_key = np.lexsort((heads, k[heads], c[heads], t[heads]))
    rt, rc, rk = t[heads][by_key], c[heads][by_key], k[heads][by_key]
    group_head = np.r_[True, (rt[1:] != rt[:-1]) | (rc[1:] != rc[:-1]) | (rk[1:] != rk[:-1])]
    starts = np.maximum.accumulate(np.where(group_head, np.arange(len(by_key)), 0))
    run_occurrence = np.empty(len(heads), np.int64)
    run_occurrence[by_key] = np.arange(len(by_key)) - starts
    occurrence = np.empty(len(g), np.int64)
    occurrence[order] = run_occurrence[run]
    return occurrence


def _step_occurrence(keys: StepKeys, key_g: np.ndarray, key_s: np.ndarray,
                     trace: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Each gpu row's occurrence by the engine's own ``step`` spans: where its trace holds
    step spans of its key, how many of them start at or before it, less one (a step's
    work starts after the step does); -1 where there are none (runs decide)."""
    steps = keys.steps[key_s >= 0]
    key_s = key_s[key_s >= 0]
    n_g = len(keys.gpus)
    if len(steps) == 0:
        return np.full(n_g, -1, np.int64)
    t = np.concatenate([trace[keys.gpus], trace[steps]]).astype(np.int64)
    k = np.concatenate([key_g, key_s]).astype(np.int64)
    s = np.concatenate([start[keys.gpus], start[steps]])
    is_step = np.r_[np.zeros(n_g, bool), np.ones(len(steps), bool)]
    order = np.lexsort((~is_step, s, k, t))  # at one time the step before its work
    t, k, step_sorted = t[order], k[order], is_step[order]
    head = np.r_[True, (t[1:] != t[:-1]) | (k[1:] != k[:-1])]
    group = np.cumsum(head) - 1
    seen = np.cumsum(step_sorted)
    before_group = (seen - step_sorted)[head]  # steps counted before each group began
    count = seen - before_group[group]
    total = np.bincount(group, weights=step_sorted).astype(np.int64)
    out = np.empty(len(order), np.int64)
    out[order] = np.where(total[group] > 0, np.maximum(count - 1, 0), -1)
    return out[:n_g]


def _nearest_of(among: np.ndarray, key_g: np.ndarray, at: np.ndarray, rank: np.ndarray,
                occurrence: np.ndarray, key_c: np.ndarray, c_at: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """`_nearest` over the gpu rows ``among`` selects, as indices into all of them."""
    rows = np.flatnonzero(among)
    best, distance = _nearest(key_g[rows], at[rows], rank[rows], occurrence[rows], key_c, c_at)
    return np.where(best >= 0, rows[np.maximum(best, 0)] if len(rows) else -1, -1), distance


def _nearest(key_g: np.ndarray, at: np.ndarray, rank: np.ndarray, occurrence: np.ndarray,
             key_c: np.ndarray, c_at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each chunk, the index (into the gpu arrays given) of the gpu span of its key
    starting nearest ``c_at`` (ties: smaller ``rank``, then ``occurrence``) and the
    distance; -1 where its key has none here."""
    n_g, n_c = len(key_g), len(key_c)
    best = np.full(n_c, -1, np.int64)
    distance = np.full(n_c, np.iinfo(np.int64).max, np.int64)
    if n_g == 0:
        return best, distance
    # One merged order: by key, time; at one time a chunk before the gpu spans, and the
    # spans best first. A chunk's neighbours are the last span before it and the first after.
    keys = np.concatenate([key_g, key_c])
    times = np.concatenate([at, c_at])
    is_gpu = np.r_[np.ones(n_g, np.int8), np.zeros(n_c, np.int8)]
    tie = np.concatenate([rank * (occurrence.max() + 1) + occurrence, np.zeros(n_c, np.int64)])
    order = np.lexsort((tie, is_gpu, times, keys))
    pos = np.empty(len(order), np.int64)
    pos[order] = np.arange(len(order))
    gpu_sorted = is_gpu[order].astype(bool)
    sorted_keys, sorted_times = keys[order], times[order]
    at_new_time = np.r_[True, (sorted_keys[1:] != sorted_keys[:-1])
                        | (sorted_times[1:] != sorted_times[:-1])]
    # The best span of a time is the first gpu position of it (chunks sort before spans);
    # the last such first at or before a chunk is the best of the latest time before it.
    first_of_time = gpu_sorted & (at_new_time | ~np.r_[False, gpu_sorted[:-1]])
    positions = np.arange(len(order))
    cpos = pos[n_g:]
    left = np.maximum.accumulate(np.where(first_of_time, positions, -1))[cpos]
    nxt = np.minimum.accumulate(np.where(gpu_sorted, positions, len(order))[::-1])[::-1]
    right = np.where(cpos + 1 < len(order), nxt[np.minimum(cpos + 1, len(order) - 1)],
                     len(order))
    for cand in (left, right):
        ok = (cand >= 0) & (cand < len(order))
        ok[ok] &= sorted_keys[cand[ok]] == key_c[ok]
        d = np.where(ok, np.abs(sorted_times[np.clip(cand, 0, len(order) - 1)] - c_at), 0)
        g_index = np.where(ok, order[np.clip(cand, 0, len(order) - 1)], 0)
        closer = ok & ((best < 0) | (d < distance) | ((d == distance) & _before(
            g_index, best, rank, occurrence)))
        best = np.where(closer, g_index, best)
        distance = np.where(closer, d, distance)
    return best, distance


def _before(a: np.ndarray, b: np.ndarray, rank: np.ndarray, occurrence: np.ndarray
            ) -> np.ndarray:
    """Gpu span ``a`` wins a tie over ``b`` (-1: none): smaller rank, then occurrence."""
    a_, b_ = np.maximum(a, 0), np.maximum(b, 0)
    return (b < 0) | (rank[a_] < rank[b_]) | ((rank[a_] == rank[b_])
                                              & (occurrence[a_] < occurrence[b_]))
