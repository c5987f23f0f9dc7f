"""NVIDIA Dynamo's request trace: JSON Lines of ``request_end`` records, optionally gzipped.

The shape is Dynamo's ``RequestTraceRecord`` (ai-dynamo/dynamo,
``lib/llm/src/request_trace/types.rs``): ``schema`` ``"dynamo.request.trace.v1"``,
``event_type``, ``event_time_unix_ms`` and, for ``request_end``, ``request``
(``RequestTraceMetrics``: ``request_id``, ``x_request_id``, ``model``, ``input_tokens``,
``output_tokens``, ``cached_tokens``, ``request_received_ms`` (Unix epoch ms),
``prefill_wait_time_ms``, ``prefill_time_ms``, ``ttft_ms``, ``total_time_ms``,
``avg_itl_ms``, ``kv_hit_rate``, ``kv_transfer_estimated_latency_ms``, ``queue_depth``,
``worker``, ``replay``, ...; absent fields are omitted). The file sinks (``jsonl``,
``jsonl_gz``) wrap each record as ``{"timestamp": ms, "event": {record}}``; both forms are
read. The durations come from ``RequestTracker`` (``lib/llm/src/protocols/common/timing.rs``):
``prefill_wait_time_ms`` is request receipt to prefill start, ``prefill_time_ms`` prefill
start to the first token, ``ttft_ms`` receipt to the first token, ``total_time_ms``
receipt to finish, all on the frontend's monotonic clock.

Dynamo records durations, not spans; each ``request_end`` becomes one trace (id hashed from
``request_id``) on service ``dynamo``, clock ``host:dynamo``, with ``t0`` =
``request_received_ms``:

* ``dynamo.request`` (stage ``server``): ``[t0, t0 + total_time_ms)`` (else up to the
  latest known time), carrying the record's counts (``cached_tokens`` gives the request's
  condition, ``input_tokens`` its ``prompt_tokens``) and ``worker``;
* ``prefill_wait`` (``queue``): ``[t0, t0 + prefill_wait_time_ms)``: receipt to prefill
  start, so it holds the frontend's preprocessing and routing as well as the queue;
* ``prefill`` (``prefill``): the next ``prefill_time_ms``;
* ``kv_transfer_estimate`` (``kv_transfer``): **Dynamo's estimate, not a measured span.**
  ``kv_transfer_estimated_latency_ms`` is an upper bound (``RequestTracker::
  kv_transfer_estimated_latency_secs``: the decode worker's first token minus the prefill
  result's arrival at the router, so router dispatch, the network and one decode forward
  pass are in it too), placed to end at the first token (``t0 + ttft_ms``, else the end of
  ``prefill``), clipped at ``t0``, and marked with ``tracer.schema.ATTR_ESTIMATED``; the
  table's metadata counts them under ``estimated`` (examples: trace ids) and analysis
  prints that count as the ``estimated_span`` line of its data-quality output. It lies
  inside ``prefill`` (whose end is the first token too) and outranks it, so under
  ``exclusive`` the estimate is taken out of the prefill time;
* ``first_byte`` at ``t0 + ttft_ms``: the tracker lives in Dynamo's frontend (the HTTP
  server, its preprocessor and router), which receives the request and sees the first
  token on its way to the response stream, so the server boundary (``dynamo.request``
  start to ``first_byte``) is exactly Dynamo's TTFT; where a duration is missing (an
  aggregated request records no prefill start) the uncovered part is the ``server``'s.

Durations that are missing, not numbers or negative place nothing. Records of other event
types (``tool_*``, ``request_payload``) are counted in the metadata's ``skipped_events``; a
``request_end`` without ``request_id`` or ``request_received_ms`` cannot be placed and is
counted in ``rejected`` (the ``rejected_span`` defect). A line that is not JSON is an
error naming it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa

from ttft.collectors.errors import TraceFileError
from ttft.collectors.importers._base import decoded_head, fits_int64, opened, rows_to_table
from ttft.tracer.schema import (
    ATTR_CACHED_TOKENS,
    ATTR_ESTIMATED,
    ATTR_PROMPT_TOKENS,
    EV_FIRST_BYTE,
)

SCHEMAS = ("dynamo.request.trace.v1", "dynamo.agent.trace.v1")
"""The record's ``schema`` values read: the current one, and the name the agent-trace docs
used before it."""
SERVICE = "dynamo"
CLOCK = "host:dynamo"
ESTIMATE = (
    "dynamo kv_transfer_estimated_latency_ms: an upper bound (decode worker's first token "
    "minus the prefill result at the router: dispatch, network, K/V transfer and one decode "
    "forward pass), placed to end at the first token; not a measured span"
)
"""The `ATTR_ESTIMATED` text of every imported transfer."""
_EXAMPLES = 3
_COUNTS = ("model", "x_request_id", "input_tokens", "output_tokens", "kv_hit_rate",
           "queue_depth", "avg_itl_ms", "ttft_ms", "total_time_ms", "worker")


def _hex(text: str, size: int) -> str:
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


def _ms_ns(value: Any) -> int | None:
    """A duration in ms → ns; None for a missing, non-number, non-finite or negative one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0 or value > 2**62 / 1e6:
        return None
    return round(value * 1e6)


class _Records:
    """Rows and counts of one file, record by record."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.skipped: Counter[str] = Counter()
        self.rejected: list[str] = []
        self.estimated: list[str] = []

    def add(self, where: str, record: dict[str, Any]) -> None:
        kind = record.get("event_type")
        if kind != "request_end":
            self.skipped[str(kind)] += 1
            return
        request = record.get("request")
        if not isinstance(request, dict):
            self.rejected.append(f"{where}: request_end without a request object")
            return
        rid, received_ms = request.get("request_id"), request.get("request_received_ms")
        if not isinstance(rid, str) or not rid:
            self.rejected.append(f"{where}: no request_id")
            return
        if isinstance(received_ms, bool) or not isinstance(received_ms, int) or not fits_int64(
            received_ms * 1_000_000
        ):
            self.rejected.append(f"{where}: request {rid}: no usable request_received_ms")
            return
        self.request(where, rid, received_ms * 1_000_000, request)

    def request(self, where: str, rid: str, t0: int, request: dict[str, Any]) -> None:
        trace = _hex(rid, 16)
        root = _hex(f"{rid}/dynamo.request", 8)
        wait, prefill = _ms_ns(request.get("prefill_wait_time_ms")), _ms_ns(
            request.get("prefill_time_ms"))
        ttft, total = _ms_ns(request.get("ttft_ms")), _ms_ns(request.get("total_time_ms"))
        kv = _ms_ns(request.get("kv_transfer_estimated_latency_ms"))
        prefill_end = None if wait is None or prefill is None else wait + prefill
        first = ttft if ttft is not None else prefill_end
        known = [t for t in (total, ttft, prefill_end, wait) if t is not None]
        attrs = {k: request[k] for k in _COUNTS if request.get(k) is not None}
        for key, name in (("cached_tokens", ATTR_CACHED_TOKENS), ("input_tokens",
                                                                  ATTR_PROMPT_TOKENS)):
            if request.get(key) is not None:
                attrs[name] = request[key]

        def span(name: str, stage: str, start: int, end: int, **extra: Any) -> None:
            self.rows.append({
                "trace_id": trace, "span_id": _hex(f"{rid}/{name}", 8),
                "parent_id": None if name == "dynamo.request" else root, "request_id": rid,
                "name": name, "stage": stage, "start_ns": t0 + start, "end_ns": t0 + end,
                "clock": CLOCK, "service": SERVICE,
                "attributes": json.dumps(extra, sort_keys=True, separators=(",", ":")),
            })

        span("dynamo.request", "server", 0, total if total is not None else max(known, default=0),
             **attrs)
        if wait is not None:
            span("prefill_wait", "queue", 0, wait)
            if prefill is not None:
                span("prefill", "prefill", wait, wait + prefill)
        if kv is not None and first is not None:
            span("kv_transfer_estimate", "kv_transfer", max(0, first - kv), first,
                 kv_transfer_estimated_latency_ms=request["kv_transfer_estimated_latency_ms"],
                 **{ATTR_ESTIMATED: ESTIMATE})
            self.estimated.append(trace)
        elif kv is not None:
            self.rejected.append(f"{where}: request {rid}: a K/V transfer estimate without "
                                 "ttft_ms or prefill times to place it")
        if ttft is not None:
            span(EV_FIRST_BYTE, "event", ttft, ttft)

    def table(self, path: Path, source_format: str) -> pa.Table:
        counts: dict[str, Any] = {}
        for key, found in (("rejected", self.rejected), ("estimated", self.estimated)):
            if found:
                counts[key] = {"count": len(found), "examples": sorted(found)[:_EXAMPLES]}
        if self.skipped:
            counts["skipped_events"] = dict(sorted(self.skipped.items()))
        return rows_to_table(self.rows, path, source_format, **counts)


def _record(line: bytes, lineno: int, path: Path) -> dict[str, Any] | None:
    """One line's record (the sink envelope unwrapped), or None for a line that holds none
    (blank, or a marker without ``schema`` such as the S3 uploader's)."""
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise TraceFileError(path, f"line {lineno}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise TraceFileError(path, f"line {lineno}: not a JSON object")
    if "schema" not in value and isinstance(value.get("event"), dict):
        value = value["event"]
    if "schema" not in value:
        return None
    if value["schema"] not in SCHEMAS:
        raise TraceFileError(path, f"line {lineno}: schema {value['schema']!r} is not one of "
                                   f"{', '.join(SCHEMAS)}")
    return value


class DynamoRequestTrace:
    name = "dynamo"
    description = "NVIDIA Dynamo request trace JSON Lines (request_end records)"

    def guess_can_open(self, path: Path) -> bool:
        data = decoded_head(path, 4096)[0].lstrip(b"\xef\xbb\xbf \t\r\n")
        return data[:1] == b"{" and any(f'"{s}"'.encode() in data for s in SCHEMAS)

    def read(self, path: Path) -> pa.Table:
        records = _Records()
        with opened(path) as stream:
            for lineno, line in enumerate(stream, 1):
                record = _record(line, lineno, path)
                if record is not None:
                    records.add(f"line {lineno}", record)
        return records.table(path, self.name)
