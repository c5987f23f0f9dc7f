"""Disaggregated serving's K/V transfer per request: blocks, bytes, duration and the
achieved bandwidth. Pure functions (no I/O).

A request's transfer runs from the start of its first ``kv_transfer`` span to the end of
its last (one span for ttft's engine; a serving stack may export several slices); its
blocks and bytes are the sums of its spans' ``tracer.schema.ATTR_KV_BLOCKS`` and
``ATTR_KV_BYTES`` (-1 when a span lacks one). Its bandwidth is ``bytes * 1e9 / dur_ns``
bytes/s, NaN where the bytes are unknown or the duration is 0. A transfer the source
estimated rather than measured (a span carrying ``ATTR_ESTIMATED``, such as Dynamo's
upper bound) is kept and marked, and left out of the bandwidth summary. A transfer names
the side that delivered its request's first token when a span carries
``ATTR_KV_FIRST_TOKEN`` (ttft's engine writes it), so a trace without run metadata still
says how it was deployed (`deployment_note`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from ttft.analysis import _column_arrays as col
from ttft.analysis.assemble import Assembly
from ttft.tracer.schema import ATTR_ESTIMATED, ATTR_KV_BLOCKS, ATTR_KV_BYTES, ATTR_KV_FIRST_TOKEN

__all__ = ["COLUMNS", "deployment", "deployment_note", "transfer_summary", "transfers"]

COLUMNS = ("trace_id", "blocks", "bytes", "dur_ns", "bytes_per_s", "estimated", "first_token")
"""The columns of `transfers`, in order."""
_NS_PER_MS = 1e6


def transfers(asm: Assembly, requests: np.ndarray) -> pd.DataFrame:
    """One row per request of ``requests`` (indices into ``asm.requests``) that has a
    ``kv_transfer`` span, in ``requests`` order; requests without one are absent.

    Returns:
        `COLUMNS`: ``trace_id``; ``blocks`` and ``bytes`` (int64, -1 when unknown);
        ``dur_ns`` (int64, first start to last end); ``bytes_per_s`` (float, NaN when
        undefined); ``estimated`` (bool); ``first_token`` (``"decode"``, ``"prefill"``
        or None: the side its spans say delivered the first token, the first that names
        one).
    """
    rows = asm.rows
    found = rows.of("kv_transfer", requests_only=True)
    requests = np.asarray(requests, dtype=np.int64)
    found = found[np.isin(rows.req[found], requests)]
    if len(found) == 0:
        return pd.DataFrame({name: pd.Series(dtype=kind) for name, kind in zip(
            COLUMNS, (object, np.int64, np.int64, np.int64, np.float64, bool, object),
            strict=True)})
    marked = pc.match_substring_regex(  # the key with a non-empty string or true as value
        col.take(rows.table.column("attributes"), found),
        re.escape(json.dumps(ATTR_ESTIMATED)) + r'[ \t\n\r]*:[ \t\n\r]*("[^"]|true)')
    side = pc.struct_field(pc.extract_regex(  # null where no span names a side
        col.take(rows.table.column("attributes"), found), re.escape(json.dumps(
            ATTR_KV_FIRST_TOKEN)) + r'[ \t\n\r]*:[ \t\n\r]*"(?P<side>decode|prefill)"'), [0])
    per_span = pd.DataFrame({
        "req": rows.req[found],
        "start": rows.start_ns[found],
        "end": rows.end_ns[found],
        "blocks": rows.int_attribute(found, ATTR_KV_BLOCKS),
        "bytes": rows.int_attribute(found, ATTR_KV_BYTES),
        "estimated": np.asarray(pc.fill_null(marked, False).to_numpy(zero_copy_only=False)),
        "first_token": pd.Series(side.to_pylist(), dtype=object),  # None stays None
    })
    per_span["blocks_unknown"] = per_span["blocks"] < 0
    per_span["bytes_unknown"] = per_span["bytes"] < 0
    g = per_span.groupby("req", sort=False).agg(
        start=("start", "min"), end=("end", "max"), blocks=("blocks", "sum"),
        bytes=("bytes", "sum"), estimated=("estimated", "any"),
        blocks_unknown=("blocks_unknown", "any"), bytes_unknown=("bytes_unknown", "any"),
        first_token=("first_token", "first"))
    order = {int(r): i for i, r in enumerate(requests)}
    g = g.iloc[np.argsort([order[int(r)] for r in g.index], kind="stable")]
    n_bytes = np.where(g["bytes_unknown"], -1, g["bytes"]).astype(np.int64)
    dur_ns = (g["end"] - g["start"]).to_numpy(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        bandwidth = np.where((n_bytes >= 0) & (dur_ns > 0), n_bytes * 1e9 / dur_ns, np.nan)
    return pd.DataFrame({
        "trace_id": asm.requests["trace_id"].to_numpy(object)[g.index.to_numpy(np.int64)],
        "blocks": np.where(g["blocks_unknown"], -1, g["blocks"]).astype(np.int64),
        "bytes": n_bytes,
        "dur_ns": dur_ns,
        "bytes_per_s": bandwidth,
        "estimated": g["estimated"].to_numpy(bool),
        "first_token": pd.Series([v if isinstance(v, str) else None
                                  for v in g["first_token"]], dtype=object),
    })


def transfer_summary(frame: pd.DataFrame) -> dict[str, Any] | None:
    """``Summary.kv_transfer`` from `transfers` (of one assembly, or concatenated over a
    dataset's partitions: every figure is the same in any order of the rows); None when
    no request has a transfer.

    Returns:
        ``requests`` (with a transfer), ``estimated`` (of them, the source's estimates),
        ``blocks`` and ``bytes`` (sums over the transfers that report them),
        ``duration_ms`` (``p50, p90, max`` over all transfers), ``bytes_per_s``
        (``p50, p90, min, max, requests`` over the measured transfers with a bandwidth;
        None without one), ``aggregate_bytes_per_s`` (their bytes over their summed
        duration; None without one) and ``first_token``: how many transfers name each side
        that delivered the first token (``{"decode": n}``; empty when none does).
    """
    if len(frame) == 0:
        return None
    dur_ms = frame["dur_ns"].to_numpy(np.int64) / _NS_PER_MS
    measured = frame[~frame["estimated"].to_numpy(bool) & frame["bytes_per_s"].notna()]
    bandwidth = measured["bytes_per_s"].to_numpy(np.float64)
    p50, p90 = np.percentile(dur_ms, [50, 90])
    out: dict[str, Any] = {
        "requests": int(len(frame)),
        "estimated": int(frame["estimated"].sum()),
        "blocks": int(frame["blocks"][frame["blocks"] >= 0].sum()),
        "bytes": int(frame["bytes"][frame["bytes"] >= 0].sum()),
        "duration_ms": {"p50": float(p50), "p90": float(p90), "max": float(dur_ms.max())},
        "bytes_per_s": None,
        "aggregate_bytes_per_s": None,
        "first_token": {str(k): int(n) for k, n in sorted(
            frame["first_token"].dropna().value_counts().items())},
    }
    if len(bandwidth):
        b50, b90 = np.percentile(bandwidth, [50, 90])
        out["bytes_per_s"] = {"p50": float(b50), "p90": float(b90),
                              "min": float(bandwidth.min()), "max": float(bandwidth.max()),
                              "requests": int(len(bandwidth))}
        total_ns = int(measured["dur_ns"].sum())
        out["aggregate_bytes_per_s"] = int(measured["bytes"].sum()) * 1e9 / total_ns
    return out


def deployment(metadata: Mapping[str, Any]) -> str | None:
    """``"disaggregated (first token: <mode>)"`` when the run metadata says the engine
    was disaggregated (``engine.disaggregated``), ``"co-located"`` when it names an engine
    that was not, None when it names no engine."""
    engine = metadata.get("engine")
    if not isinstance(engine, Mapping):
        return None
    disagg = engine.get("disaggregated")
    if not isinstance(disagg, Mapping):
        return "co-located"
    mode = disagg.get("first_token")
    return "disaggregated" + (f" (first token: {mode})" if isinstance(mode, str) else "")


def deployment_note(metadata: Mapping[str, Any],
                    kv_transfer: Mapping[str, Any] | None = None) -> str | None:
    """For a disaggregated run, one line saying where the first token came from and what
    that means for TTFT; None for a co-located run or one that does not say.

    The run metadata (``engine.disaggregated``) says it first; a trace without its mode
    (``ttft serve --trace-out``, ``ttft trace`` of a server, an imported trace) is
    disaggregated when requests have ``kv_transfer`` spans (``kv_transfer``:
    ``Summary.kv_transfer``), its first-token side the one those spans name
    (`transfers`).
    """
    mode = deployment(metadata)
    if kv_transfer and (mode is None or "(first token:" not in mode):
        mode = _mode_of_spans(kv_transfer) or mode
    if mode is None or not mode.startswith("disaggregated"):
        return None
    one_side = re.fullmatch(r"disaggregated \(first token: (decode|prefill)\)", mode)
    if one_side is None:
        return f"deployment: {mode}"
    where = ("the K/V transfer follows the first token (it shows in the second token's time)"
             if one_side[1] == "prefill" else "TTFT includes the K/V transfer")
    return f"deployment: {mode}: {where}"


def _mode_of_spans(kv_transfer: Mapping[str, Any]) -> str | None:
    """``disaggregated (first token: SIDE)`` when every transfer names one side; else
    what the transfers say, in words."""
    requests = int(kv_transfer.get("requests") or 0)
    if not requests:
        return None
    sides = dict(kv_transfer.get("first_token") or {})
    if len(sides) == 1 and sum(sides.values()) == requests:
        return f"disaggregated (first token: {next(iter(sides))})"
    if not sides:
        return (f"disaggregated ({requests:,} requests have a K/V transfer; the trace does "
                "not record which side sent the first token)")
    named = ", ".join(f"{side} for {n:,}" for side, n in sides.items())
    return f"disaggregated ({requests:,} requests have a K/V transfer; first token: {named})"
