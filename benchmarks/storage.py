"""Storage: bytes per span of a ttft Parquet trace against OTLP/JSON Lines of the same spans.

    python benchmarks/storage.py [--requests 20000] [--seed 0] [--json PATH]

Generates a synthetic trace (``ttft.collectors.synthetic``: client, server, engine and GPU
spans with their events), writes it with ``ttft.collectors.write_trace`` and writes
the same spans as OTLP/JSON Lines the way an OpenTelemetry Collector's file exporter does
(one ``ExportTraceServiceRequest`` per line, 512 spans a line, hex ids, int64 times as
strings, an empty ``status`` on each span as in the example of OpenTelemetry's file-exporter
specification; a resource per service and clock; point events as events of their parent span;
stage, clock and request id as ``ttft.*`` attributes where the span name does not say
them), then reads the JSON back through ttft's importer to check it holds the same rows.
Goals: ≤ 40 bytes per span and ≥ 10× smaller than the OTLP/JSON Lines.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

GOAL_BYTES_PER_SPAN = 40
GOAL_RATIO = 10
BATCH = 512


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": _attributes(v)}}
    return {"stringValue": str(v)}


def _attributes(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in d.items() if v is not None]


def otlp_lines(rows: list[dict[str, Any]]) -> list[bytes]:
    """The rows as OTLP/JSON Lines (see the module docstring)."""
    from ttft.tracer.schema import stage_of

    spans: dict[str, dict[str, Any]] = {}
    resource_of: dict[str, tuple[str, str]] = {}
    events: list[dict[str, Any]] = []
    for r in rows:
        if r["stage"] == "event" and r["parent_id"]:
            events.append(r)
            continue
        attrs = json.loads(r["attributes"] or "{}")
        if r["stage"] != stage_of(r["name"]) and not (
            r["stage"] == "event" and r["start_ns"] == r["end_ns"]
        ):
            attrs["ttft.stage"] = r["stage"]
        if r["request_id"] is not None:
            attrs["ttft.request_id"] = r["request_id"]
        span = {
            "traceId": r["trace_id"],
            "spanId": r["span_id"],
            "name": r["name"],
            "kind": 1,
            "startTimeUnixNano": str(r["start_ns"]),
            "endTimeUnixNano": str(r["end_ns"]),
            "attributes": _attributes(attrs),
            "status": {},  # the Collector writes it for every span (the OTLP file exporter spec)
        }
        if r["parent_id"]:
            span["parentSpanId"] = r["parent_id"]
        spans[r["span_id"]] = span
        resource_of[r["span_id"]] = (r["service"], r["clock"])
    for e in events:
        target = spans.get(e["parent_id"])
        event = {
            "timeUnixNano": str(e["start_ns"]),
            "name": e["name"],
            "attributes": _attributes(json.loads(e["attributes"] or "{}")),
        }
        if target is None:  # an event whose parent is elsewhere stays a zero-length span
            continue
        target.setdefault("events", []).append(event)
    by_resource: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for span_id, span in spans.items():
        by_resource[resource_of[span_id]].append(span)
    lines = []
    for (service, clock), group in by_resource.items():
        resource = {"attributes": _attributes({"service.name": service, "ttft.clock": clock})}
        for i in range(0, len(group), BATCH):
            request = {
                "resourceSpans": [
                    {
                        "resource": resource,
                        "scopeSpans": [{"scope": {"name": "ttft"}, "spans": group[i : i + BATCH]}],
                    }
                ]
            }
            lines.append(json.dumps(request, separators=(",", ":")).encode() + b"\n")
    return lines


def main() -> None:
    from _figures import Figure, add_json_option, write  # benchmarks/ is the script's folder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    add_json_option(parser)
    args = parser.parse_args()

    from ttft.collectors import read_spans, write_trace
    from ttft.collectors.synthetic import generate

    synthetic = generate(args.requests, seed=args.seed)
    table = synthetic.table
    n = table.num_rows
    with tempfile.TemporaryDirectory() as tmp:
        parquet = Path(tmp) / "trace.parquet"
        started = time.perf_counter()
        write_trace(parquet, table, synthetic.metadata)
        write_s = time.perf_counter() - started
        otlp = Path(tmp) / "trace.jsonl"
        rows = table.to_pylist()
        lines = otlp_lines(rows)
        otlp.write_bytes(b"".join(lines))
        parquet_bytes = parquet.stat().st_size
        otlp_bytes = otlp.stat().st_size
        gzip_bytes = len(gzip.compress(otlp.read_bytes(), compresslevel=6))
        back = read_spans(otlp)
    same_rows = back.num_rows == n
    per_span = parquet_bytes / n
    ratio = otlp_bytes / parquet_bytes
    print(
        f"{args.requests:,} synthetic requests, {n:,} spans and events "
        f"(ttft Parquet written in {write_s:.2f} s)"
    )
    print(f"{'format':<34}{'bytes':>14}{'B/span':>9}{'× Parquet':>11}")
    for name, size in (
        ("ttft Parquet", parquet_bytes),
        ("OTLP/JSON Lines", otlp_bytes),
        ("OTLP/JSON Lines, gzip -6", gzip_bytes),
    ):
        print(f"{name:<34}{size:>14,}{size / n:>9.1f}{size / parquet_bytes:>11.1f}")
    print(
        f"OTLP/JSON read back through ttft's importer: {back.num_rows:,} rows "
        f"({'the same count' if same_rows else 'DIFFERENT from'} the trace's)"
    )
    print(f"goals: ≤ {GOAL_BYTES_PER_SPAN} B/span, ≥ {GOAL_RATIO}× smaller than OTLP/JSON Lines")
    write(
        args.json,
        [
            Figure("storage", "ttft Parquet", per_span, "B/span", f"≤ {GOAL_BYTES_PER_SPAN}",
                   per_span <= GOAL_BYTES_PER_SPAN),
            Figure("storage", "OTLP/JSON Lines / ttft Parquet", ratio, "×", f"≥ {GOAL_RATIO}",
                   ratio >= GOAL_RATIO),
            Figure("storage", "OTLP/JSON Lines, gzip -6 / ttft Parquet",
                   gzip_bytes / parquet_bytes, "×"),
            Figure("storage", "OTLP/JSON read back: same row count", float(same_rows), "bool",
                   "= 1", same_rows),
        ],
    )


if __name__ == "__main__":
    main()
