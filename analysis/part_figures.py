"""The summary's figures as reductions over a `PartSet` of `PartRows` (``order_stats``):
each part gives counts, exact sums and the values of a column, and exact percentiles
come from ``order_stats.percentiles``, so one table (one part in memory) and a dataset's
partitions (spilled, read one at a time) give one summary bit for bit, and whoever merges
the partitions holds none of their requests (docs/architecture.md, "One program").

Definitions are ``analysis.summary``'s (docs/design.md): percentiles are numpy's linear
ones over every request, means exact from integer sums (``math.fsum`` for float values).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from ttft.analysis.after_first_token import KEYS
from ttft.analysis.attribution import Attribution
from ttft.analysis.order_stats import InMemory, Named, PartSet, exact_sum, percentiles
from ttft.analysis.part_rows import EachPart, PartRows, Select, stage_matrix
from ttft.analysis.quality import EXAMPLES_KEPT
from ttft.analysis.request_values import RequestValues
from ttft.tracer.schema import OUTCOMES

__all__ = ["EachPart", "PartRows", "after_first_token", "failed_first_token", "failure_counts",
           "failure_examples", "kv_transfer", "load_figures", "ms_figures", "one_part",
           "ms_column", "stage_columns", "stage_matrix", "stage_rows", "stages", "stages_with_time",
           "summary_asks",
           "tail_rows"]

_NS_PER_MS = 1e6
PERCENTILES = (50, 90, 99)
def one_part(attr: Attribution, values: RequestValues | None = None) -> InMemory:
    """One attribution (and its values, else none) as the one part of a `PartSet`."""
    return InMemory([PartRows(attr, values or RequestValues({}, {}, pd.DataFrame()))])


def stages(parts: PartSet) -> np.ndarray:
    """The stage names (every part's attribution has the same columns)."""
    names = parts.map(lambda p: tuple(p.attribution.attributed.columns))
    if len(set(names)) > 1:
        raise ValueError("parts were attributed with different stages")
    return np.asarray(names[0] if names else ())


def ms_column(column: Callable[[PartRows], np.ndarray], name: tuple[Any, ...] | None = None
              ) -> Callable[[PartRows], np.ndarray]:
    """An int64 ns column in ms, `Named` ``("ms", *name)`` when given a name (a summary
    finds its percentiles with its others: `summary_asks`)."""
    def ms(p: PartRows) -> np.ndarray:
        return column(p).astype(np.float64) / _NS_PER_MS

    return ms if name is None else Named(("ms", *name), ms)


def ms_figures(parts: PartSet, column: Callable[[PartRows], np.ndarray],
               name: tuple[Any, ...] | None = None) -> dict[str, float] | None:
    """p50/p90/p99/mean in ms of an int64 ns column (mean from the integer sum; None for
    no values); ``name`` as `ms_column`'s."""
    (found,) = percentiles(parts, [ms_column(column, name)], PERCENTILES)
    if found is None:
        return None
    def sums(p: PartRows) -> tuple[int, int]:
        values = column(p)
        return len(values), int(values.sum())

    n, total = np.sum(parts.map(sums), axis=0)
    out = {f"p{q}": float(v) for q, v in zip(PERCENTILES, found, strict=True)}
    out["mean"] = float(np.int64(total) / int(n) / _NS_PER_MS)
    return out


def _stage_sums(p: PartRows, select: Select) -> tuple[Any, ...]:
    """A part's count, TTFT sum, stage sums and stages with time of the requests
    ``select`` keeps."""
    rows = p.rows(select)
    att, raw, ttft = p.att[rows], p.raw[rows], p.ttft[rows]
    return (len(ttft), int(ttft.sum()), att.sum(axis=0), raw.sum(axis=0),
            (att > 0).any(axis=0) | (raw > 0).any(axis=0))


def stage_columns(select: Select, used: np.ndarray, name: tuple[Any, ...] | None = None
                  ) -> list[Callable[[PartRows], np.ndarray]]:
    """The ms of each stage of ``used`` of the requests ``select`` keeps, cut from one
    matrix a part and pass (`EachPart`); `Named` ``("stage", *name, stage)`` with a name."""
    matrix = EachPart(lambda p: stage_matrix(p.att, p.rows(select), used, _NS_PER_MS))
    columns = [(lambda p, i=i: matrix(p)[i]) for i in range(len(used))]
    return columns if name is None else [Named(("stage", *name, int(j)), c)
                                         for j, c in zip(used, columns, strict=True)]


def stage_rows(parts: PartSet, select: Select = None, name: tuple[Any, ...] | None = None
               ) -> pd.DataFrame:
    """``summary.stage_table`` over the parts' requests ``select`` keeps; ``name`` as
    `stage_columns`'."""
    names = stages(parts)

    found = parts.map(lambda p: _stage_sums(p, select))
    columns = ["p50", "p90", "p99", "mean", "share", "raw_mean", "overlap_mean"]
    n = sum(f[0] for f in found)
    if n == 0:
        return pd.DataFrame(columns=columns, dtype=float)
    used = np.flatnonzero(np.any([f[4] for f in found], axis=0))
    att = np.sum([f[2] for f in found], axis=0).astype(np.int64)[used]
    raw = np.sum([f[3] for f in found], axis=0).astype(np.int64)[used]
    total = float(np.int64(sum(f[1] for f in found)))
    figures = percentiles(parts, stage_columns(select, used, name), PERCENTILES)
    table = pd.DataFrame(np.asarray(figures).reshape(len(used), 3), index=names[used],
                         columns=["p50", "p90", "p99"])
    table["mean"] = att / n / _NS_PER_MS
    table["share"] = att / total if total > 0 else 0.0
    table["raw_mean"] = raw / n / _NS_PER_MS
    table["overlap_mean"] = (raw - att) / n / _NS_PER_MS
    table.index.name = "stage"
    return table[columns]


def _band_sums(parts: PartSet, used: np.ndarray, keep: Callable[[np.ndarray], np.ndarray]
               ) -> tuple[int, np.ndarray]:
    """How many requests ``keep`` (of their TTFTs) keeps, and their attributed sums."""
    found = parts.map(lambda p: (int(keep(p.ttft).sum()),
                                 p.att[keep(p.ttft)][:, used].sum(axis=0)))
    return sum(f[0] for f in found), np.sum([f[1] for f in found], axis=0).astype(np.int64)


_TTFT_NS = Named(("ttft_ns",), lambda p: p.ttft)
_TAIL_QS = (40, 50, 60, 99)


def tail_rows(parts: PartSet) -> pd.DataFrame:
    """``summary.tail_mix`` over the parts."""
    (found,) = percentiles(parts, [_TTFT_NS], _TAIL_QS)
    if found is None:
        return pd.DataFrame(columns=["tail_mean", "median_mean"], dtype=float)
    p40, p50, p60, p99 = found
    used = np.flatnonzero(np.any(parts.map(lambda p: (p.att > 0).any(axis=0)), axis=0))
    n, tail = _band_sums(parts, used, lambda t: t >= p99)
    n_band, middle = _band_sums(parts, used, lambda t: (t >= p40) & (t <= p60))
    if n_band == 0:
        nearest = min(parts.map(lambda p: float(np.abs(p.ttft - p50).min()) if len(p.ttft)
                                else np.inf))
        n_band, middle = _band_sums(parts, used, lambda t: np.abs(t - p50) == nearest)
    return pd.DataFrame({"tail_mean": tail / n / _NS_PER_MS,
                         "median_mean": middle / n_band / _NS_PER_MS},
                        index=stages(parts)[used])


def failure_counts(parts: PartSet, condition: str | None = None) -> dict[str, int]:
    """Failed requests by outcome, in ``OUTCOMES`` order (of one condition)."""
    def counts(p: PartRows) -> pd.Series:
        failed = p.attribution.failed
        if condition is not None:
            failed = failed[failed["condition"] == condition]
        return failed["outcome"].value_counts()

    found = [c for c in parts.map(counts) if len(c)]
    total = pd.concat(found).groupby(level=0).sum() if found else pd.Series(dtype=int)
    return {kind: int(total[kind]) for kind in OUTCOMES if kind in total.index}


def failure_examples(parts: PartSet, counts: Mapping[str, int]
                     ) -> dict[str, list[dict[str, Any]]]:
    """Up to `EXAMPLES_KEPT` failed requests per outcome, the smallest trace ids (parts'
    candidates in part order, sorted stably: the whole's order)."""
    def smallest(p: PartRows) -> pd.DataFrame:
        failed = p.attribution.failed
        return pd.concat([failed[failed["outcome"] == kind].sort_values("trace_id", kind="stable")
                          .head(EXAMPLES_KEPT) for kind in counts] or [failed.head(0)])

    found = parts.map(smallest)
    failed = pd.concat([f for f in found if len(f)] or found[:1], ignore_index=True)
    out: dict[str, list[dict[str, Any]]] = {}
    for kind in counts:
        rows = (failed[failed["outcome"] == kind].sort_values("trace_id", kind="stable")
                .head(EXAMPLES_KEPT))
        out[kind] = [
            {"trace_id": str(r.trace_id),
             "status_code": None if pd.isna(r.status_code) else int(r.status_code),
             "error": None if not isinstance(r.error, str) else r.error}
            for r in rows.itertuples(index=False)
        ]
    return out


def _failed_ttft(p: PartRows) -> np.ndarray:
    ttft = p.attribution.failed["ttft_ns"].to_numpy(dtype=np.int64)
    return ttft[ttft >= 0]


def failed_first_token(parts: PartSet) -> dict[str, Any] | None:
    """The failed requests that saw a first token: how many, and their TTFT."""
    found = ms_figures(parts, _failed_ttft, ("failed",))
    return None if found is None else {
        "requests": int(sum(parts.map(lambda p: len(_failed_ttft(p))))), "ttft_ms": found}


_AFTER = [Named(("after", k), lambda p, k=k: np.asarray(p.values.after_first_token[k],
                                                          np.float64) / _NS_PER_MS)
          for k in KEYS]


def after_first_token(parts: PartSet) -> dict[str, dict | None]:
    """``after_first_token.summarize_values`` over the parts."""
    columns = _AFTER
    found = percentiles(parts, columns, PERCENTILES)
    sums = parts.map(lambda p: [(len(c(p)), exact_sum(c(p))) for c in columns])
    out: dict[str, dict | None] = {}
    for i, (key, figures) in enumerate(zip(KEYS, found, strict=True)):
        if figures is None:
            out[key] = None
            continue
        n = sum(s[i][0] for s in sums)
        figure = {f"p{q}": float(v) for q, v in zip(PERCENTILES, figures, strict=True)}
        figure["mean"] = float(sum((s[i][1] for s in sums), Fraction(0))) / n
        figure["requests"] = int(n)
        out[key] = figure
    return out


def load_figures(parts: PartSet) -> dict[str, Any] | None:
    """``analysis.load.load``'s figures over the parts: ``duration_ns``, ``requests``
    completed, ``output_tokens``, ``content_filter``, and ``e2e``: p50/p90/p99/mean of the
    completed requests' end-to-end ns (None without one); None without a client span."""
    def sums(p: PartRows) -> tuple[Any, ...] | None:
        v = p.values.load
        if len(v["start_ns"]) == 0:
            return None
        done = v["completed"]
        return (int(v["start_ns"].min()), int(v["end_ns"].max()), int(done.sum()),
                int(v["output_tokens"][done].sum()), int((done & v["content_filter"]).sum()))

    found = [f for f in parts.map(sums) if f is not None]
    if not found:
        return None

    return {"duration_ns": max(f[1] for f in found) - min(f[0] for f in found),
            "requests": sum(f[2] for f in found),
            "output_tokens": sum(f[3] for f in found),
            "content_filter": sum(f[4] for f in found),
            "e2e": ms_figures(parts, _e2e, ("e2e",))}


def _e2e(p: PartRows) -> np.ndarray:
    """The completed requests' end-to-end ns."""
    v = p.values.load
    return (v["end_ns"] - v["start_ns"])[v["completed"]]


def _bounds(values: np.ndarray) -> tuple[float, float] | None:
    return (float(values.min()), float(values.max())) if len(values) else None


def _measured(p: PartRows) -> pd.DataFrame:
    """The K/V transfers whose bandwidth was measured, not estimated."""
    frame = p.values.transfers
    return frame[~frame["estimated"].to_numpy(bool) & frame["bytes_per_s"].notna()]

_TRANSFERS = [Named(("transfer_ms",), lambda p: p.values.transfers["dur_ns"].to_numpy(np.int64)
                    / _NS_PER_MS),
              Named(("transfer_bytes_per_s",),
                    lambda p: _measured(p)["bytes_per_s"].to_numpy(np.float64))]
_TRANSFER_QS = (50, 90)


def kv_transfer(parts: PartSet) -> dict[str, Any] | None:
    """``analysis.transfer.transfer_summary`` over the parts."""
    def sums(p: PartRows) -> tuple[Any, ...]:
        frame, kept = p.values.transfers, _measured(p)
        return (len(frame), int(frame["estimated"].sum()),
                int(frame["blocks"][frame["blocks"] >= 0].sum()),
                int(frame["bytes"][frame["bytes"] >= 0].sum()),
                int(kept["dur_ns"].sum()), int(kept["bytes"].sum()),
                frame["first_token"].dropna().value_counts(),
                float((frame["dur_ns"].to_numpy(np.int64) / _NS_PER_MS).max(initial=-np.inf)),
                _bounds(kept["bytes_per_s"].to_numpy(np.float64)))

    found = parts.map(sums)
    if sum(f[0] for f in found) == 0:
        return None
    duration, bandwidth = percentiles(parts, _TRANSFERS, _TRANSFER_QS)
    bounds = [f[8] for f in found if f[8] is not None]
    counts = [f[6] for f in found if len(f[6])]
    first = pd.concat(counts).groupby(level=0).sum() if counts else pd.Series(dtype=int)
    out: dict[str, Any] = {
        "requests": int(sum(f[0] for f in found)),
        "estimated": int(sum(f[1] for f in found)),
        "blocks": int(sum(f[2] for f in found)),
        "bytes": int(sum(f[3] for f in found)),
        "duration_ms": {"p50": float(duration[0]), "p90": float(duration[1]),
                        "max": max(f[7] for f in found)},
        "bytes_per_s": None,
        "aggregate_bytes_per_s": None,
        "first_token": {str(k): int(n) for k, n in sorted(first.items())},
    }
    if bandwidth is not None:
        requests = int(sum(parts.map(lambda p: len(_measured(p)))))
        out["bytes_per_s"] = {"p50": float(bandwidth[0]), "p90": float(bandwidth[1]),
                              "min": min(b[0] for b in bounds),
                              "max": max(b[1] for b in bounds),
                              "requests": requests}
        out["aggregate_bytes_per_s"] = (sum(f[5] for f in found) * 1e9
                                        / sum(f[4] for f in found))
    return out




def stages_with_time(p: PartRows, conditions: Sequence[str]) -> dict[tuple[str], np.ndarray]:
    """Which stages have time in a part, among all its requests (``("all",)``) and those
    of each of ``conditions`` (``(condition,)``): what `stage_rows` finds for its columns,
    from one boolean matrix."""
    timed = (p.att > 0) | (p.raw > 0)
    out = {("all",): timed.any(axis=0)}
    out.update({(c,): timed[p.of_condition(c)].any(axis=0) for c in conditions})
    return out


def summary_asks(conditions: Sequence[str], timed: Sequence[Mapping[tuple[str], np.ndarray]]
                 ) -> list[tuple[Named, tuple[float, ...]]]:
    """Every percentile a summary takes of plain columns (``order_stats.remembered``
    finds them in one set of passes): TTFT overall and for each of ``conditions``, their
    stages' (those with time in any part: each part's `stages_with_time` in ``timed``),
    after the first token, the failed requests', end to end, the tail's and K/V
    transfers'. Each is the `Named` column the figure above asks for itself."""
    selects: dict[tuple[str], Select] = {("all",): None}
    selects.update({(c,): (lambda p, c=c: p.of_condition(c)) for c in conditions})
    asks: list[tuple[Named, tuple[float, ...]]] = []
    for name, select in selects.items():
        used = np.flatnonzero(np.any([t[name] for t in timed], axis=0)) if timed else []
        asks += [(c, PERCENTILES) for c in stage_columns(select, np.asarray(used, np.intp),
                                                          name)]
    ttft = [ms_column(lambda p: p.ttft, ("ttft",))]
    ttft += [ms_column(lambda p, c=c: p.ttft[p.of_condition(c)], ("ttft", c))
             for c in conditions]
    asks += [(c, PERCENTILES) for c in [*ttft, *_AFTER, ms_column(_failed_ttft, ("failed",)),
                                       ms_column(_e2e, ("e2e",))]]
    return asks + [(_TTFT_NS, _TAIL_QS)] + [(c, _TRANSFER_QS) for c in _TRANSFERS]
