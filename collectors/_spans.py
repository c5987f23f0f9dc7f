"""Span rows and tables → exactly the span schema, with errors that name row and field.

``ttft_fields`` lives in :mod:`ttft.collectors.rows` (the row builder) and is re-exported
here for the importers that still import it from this module."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ttft.collectors.rows import ttft_fields
from ttft.tracer.schema import COLUMNS, SPAN_SCHEMA, SPAN_SCHEMA_V2
from ttft.tracer.span_ids import is_v2

__all__ = ["Fail", "conform", "location", "to_span_table", "ttft_fields", "value_error"]

Fail = Callable[..., Exception]
"""Builds the exception for a reason, optionally with ``row=`` and ``field=``."""


def location(row: int | None, field: str | None) -> str:
    return (f", row {row}" if row is not None else "") + (
        f", field {field!r}" if field is not None else ""
    )


def value_error(reason: str, row: int | None = None, field: str | None = None) -> Exception:
    where = location(row, field).removeprefix(", ")
    return ValueError(f"{where}: {reason}" if where else reason)


def conform(table: pa.Table, fail: Fail, *, extra_ok: bool, check_rows: bool = True) -> pa.Table:
    """Cast ``table`` to exactly SPAN_SCHEMA, or SPAN_SCHEMA_V2 where its ids are bytes
    (``tracer.span_ids.is_v2``), without metadata; with ``check_rows`` also reject nulls
    in required columns and ``end_ns < start_ns`` (a writer does; a reader leaves such
    rows to analysis, which counts them as data-quality defects and goes on)."""
    names = table.column_names
    extra = [n for n in names if n not in COLUMNS]
    if extra and not extra_ok:
        raise fail(f"unknown column(s): {', '.join(extra)}")
    schema = SPAN_SCHEMA_V2 if is_v2(table.schema) else SPAN_SCHEMA
    missing = [f.name for f in schema if f.name not in names and not f.nullable]
    if missing:
        raise fail(f"missing required column(s): {', '.join(missing)}")
    arrays = []
    for field in schema:
        if field.name not in names:
            arrays.append(pa.nulls(table.num_rows, field.type))
            continue
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowException, ValueError, TypeError) as exc:
                raise fail(f"cannot cast {column.type} to {field.type} ({exc})",
                           field=field.name) from exc
        if check_rows and not field.nullable and column.null_count:
            row = pc.index(pc.is_null(column), True).as_py()
            raise fail("null in a required column", row=row, field=field.name)
        arrays.append(column)
    table = pa.Table.from_arrays(arrays, schema=schema)
    if not check_rows:
        return table
    backwards = pc.less(table.column("end_ns"), table.column("start_ns"))
    if pc.any(backwards).as_py():
        row = pc.index(backwards, True).as_py()
        start_ns, end_ns = table.column("start_ns")[row], table.column("end_ns")[row]
        raise fail(f"end_ns {end_ns} is before start_ns {start_ns}", row=row, field="end_ns")
    return table


def to_span_table(data: pa.Table | pa.RecordBatch | Iterable[Mapping[str, Any]]) -> pa.Table:
    """Convert spans to a table with exactly SPAN_SCHEMA (SPAN_SCHEMA_V2 for a table whose
    ids are bytes already).

    Args:
        data: a table or record batch (columns are cast; dictionary columns may be plain
            strings; missing nullable columns become nulls) or row dicts keyed by column name
            (missing keys are null).

    Raises:
        ValueError: an unknown column, a missing or null required column, a value that does
            not cast, or ``end_ns < start_ns``; the message names the row and field.
    """
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return conform(data, value_error, extra_ok=False)
    rows = data if isinstance(data, list) else list(data)
    for index, row in enumerate(rows):
        unknown = [key for key in row if key not in COLUMNS]
        if unknown:
            raise value_error(f"unknown field(s) {', '.join(map(str, unknown))}", row=index)
    try:
        table = pa.Table.from_pylist(rows, schema=SPAN_SCHEMA)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise ValueError(f"rows do not fit the span schema ({exc})") from exc
    return conform(table, value_error, extra_ok=False)
