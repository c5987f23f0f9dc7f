"""Build small span tables for analysis tests."""

from __future__ import annotations

import json

import pyarrow as pa

from ttft.tracer.schema import SPAN_SCHEMA, stage_of


def sid(n: int) -> str:
    return format(n, "016x")


def tid(n: int) -> str:
    return format(n, "032x")


def row(
    trace: int,
    span: int | None,
    name: str,
    start_ns: int,
    end_ns: int,
    *,
    parent: int | None = None,
    stage: str | None = None,
    clock: str = "host:test",
    service: str = "engine",
    request_id: str | None = None,
    **attributes,
) -> dict:
    return {
        "trace_id": tid(trace),
        "span_id": None if span is None else sid(span),
        "parent_id": None if parent is None else sid(parent),
        "request_id": request_id,
        "name": name,
        "stage": stage or stage_of(name),
        "start_ns": start_ns,
        "end_ns": end_ns,
        "clock": clock,
        "service": service,
        "attributes": json.dumps(attributes),
    }


def event(trace: int, span: int, name: str, t_ns: int, *, parent: int | None = None, **kw) -> dict:
    return row(trace, span, name, t_ns, t_ns, parent=parent, stage="event", **kw)


def table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SPAN_SCHEMA)
