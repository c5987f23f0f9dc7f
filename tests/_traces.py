"""Helpers shared by tests that transform span tables (importable from every test module)."""

from __future__ import annotations

import pyarrow as pa


def scaled(table: pa.Table, num: int, den: int) -> pa.Table:
    """Every start_ns/end_ns scaled by num/den around the table's earliest start: every
    duration, gap and TTFT scales by the same factor (up to 1 ns), and engine spans keep
    their place against the requests they are joined to."""
    start = table.column("start_ns").to_numpy()
    end = table.column("end_ns").to_numpy()
    t0 = start.min()
    for name, values in (("start_ns", start), ("end_ns", end)):
        i = table.schema.get_field_index(name)
        table = table.set_column(
            i, table.schema.field(i), pa.array(t0 + (values - t0) * num // den)
        )
    return table
