"""Span ids as bytes (schema version 2) and as hex text (version 1): the one place a table
changes from one to the other (docs/design.md, "Schema versions").

A W3C trace id is 16 bytes and a span id 8, written as 32 and 16 lowercase hex digits.
Version 1 holds the text; version 2 the bytes (``SPAN_SCHEMA_V2``), which take 16 + 8 + 8
bytes a row in place of about 76 with their offsets, and need no UTF-8 check on reading.
`to_v2` converts a version-1 table whose every id is W3C lowercase hex (what every ttft
writer and importer writes); an empty span or parent id names no span, as a null does, and
becomes null. A table with another id (a test's ``"t1"``, upper-case hex, a file from a
tool that writes its own) stays version 1: `to_v2` returns None, so an id's text is never
changed, and neither is any answer that quotes it. `to_v1` gives the text back:
``to_v1(to_v2(t))`` is ``t``, but for empty ids read back as null.

Both work a chunk at a time with numpy over Arrow's buffers: no Python per row.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyarrow and numpy are imported where a table is converted
    import numpy as np
    import pyarrow as pa

TRACE_BYTES = 16
SPAN_BYTES = 8
ID_BYTES = {"trace_id": TRACE_BYTES, "span_id": SPAN_BYTES, "parent_id": SPAN_BYTES}
"""The bytes of each id column in version 2."""


def is_v2(schema: pa.Schema) -> bool:
    """Whether a table's (or file's) ids are bytes: its ``trace_id`` is 16-byte binary."""
    import pyarrow as pa

    index = schema.get_field_index("trace_id")
    return index >= 0 and schema.field(index).type == pa.binary(TRACE_BYTES)


def to_v2(table: pa.Table) -> pa.Table | None:
    """A version-1 span table with its ids as bytes (``SPAN_SCHEMA_V2``'s id columns, the
    other columns and the schema metadata as they are), or None when some id is not W3C
    lowercase hex: a trace id of other than 32 such digits, a span or parent id of other
    than 16 (or empty, or null)."""
    import pyarrow as pa

    from ttft.tracer.schema import SPAN_SCHEMA_V2

    if is_v2(table.schema):
        return table
    columns = []
    for field in table.schema:
        width = ID_BYTES.get(field.name)
        if width is None:
            columns.append(table.column(field.name))
            continue
        chunks = []
        for chunk in table.column(field.name).chunks:
            found = _unhexed(chunk, width, nullable=field.name != "trace_id")
            if found is None:
                return None
            chunks.append(found)
        columns.append(pa.chunked_array(chunks, pa.binary(width)))
    fields = [SPAN_SCHEMA_V2.field(f.name) if f.name in ID_BYTES else f for f in table.schema]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=table.schema.metadata))


def to_v1(table: pa.Table) -> pa.Table:
    """A version-2 span table with its ids as lowercase hex text (``SPAN_SCHEMA``'s id
    columns; the others and the schema metadata as they are); a version-1 table itself."""
    import pyarrow as pa

    from ttft.tracer.schema import SPAN_SCHEMA

    if not is_v2(table.schema):
        return table
    columns = [pa.chunked_array(hex_texts(table.column(f.name)), pa.string())
               if f.name in ID_BYTES else table.column(f.name) for f in table.schema]
    fields = [SPAN_SCHEMA.field(f.name) if f.name in ID_BYTES else f for f in table.schema]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=table.schema.metadata))


def same_layout(tables: list[pa.Table]) -> list[pa.Table]:
    """``tables`` in one layout, so they concatenate: version 2 when every one that holds
    rows is (an empty one converts either way), else version 1 (`to_v1`)."""
    rows = [t for t in tables if t.num_rows]
    if rows and all(is_v2(t.schema) for t in rows):
        return [t if is_v2(t.schema) else to_v2(t) for t in tables]  # type: ignore[misc]
    return [to_v1(t) for t in tables]


# --- the conversions, a chunk at a time ---------------------------------------------------

@cache
def _hex_digits() -> np.ndarray:
    """Each byte's value as a lowercase hex digit (0-15), 255 for a byte that is none."""
    import numpy as np

    digits = np.full(256, 255, np.uint8)
    for i, c in enumerate(b"0123456789abcdef"):
        digits[c] = i
    return digits


@cache
def _hex_pairs() -> np.ndarray:
    """Each byte's two lowercase hex digits as one little-endian uint16 (the first digit
    in the low byte), so a byte array maps to its text by one gather."""
    import numpy as np

    text = b"0123456789abcdef"
    values = np.arange(256)
    return (np.frombuffer(text, np.uint8)[values >> 4].astype(np.uint16)
            | (np.frombuffer(text, np.uint8)[values & 15].astype(np.uint16) << 8))


def validity(arr: pa.Array) -> np.ndarray:
    """One chunk's non-null mask, from its validity bitmap."""
    import numpy as np

    if not arr.null_count:
        return np.ones(len(arr), bool)
    bits = np.unpackbits(np.frombuffer(arr.buffers()[0], np.uint8), bitorder="little")
    return bits[arr.offset : arr.offset + len(arr)].astype(bool)


def _unhexed(arr: pa.Array, width: int, nullable: bool) -> pa.Array | None:
    """One chunk of hex text as ``width``-byte binary (None: some value is not ``2 *
    width`` hex digits; with ``nullable``, null and empty values are null)."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_dictionary(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.string())
    if not (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)):
        return None
    n = len(arr)
    if n == 0:
        return pa.array([], pa.binary(width))
    valid = validity(arr)
    if not nullable and not valid.all():
        return None
    offsets = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset : arr.offset + n + 1]
    lengths = np.diff(offsets)
    present = valid & (lengths > 0)
    if not nullable and not present.all():
        return None
    if not (lengths[present] == 2 * width).all():
        return None
    data = arr.buffers()[2]
    raw = np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8)
    if (lengths[~present] == 0).all():  # the present values lie end to end
        text = raw[int(offsets[0]) : int(offsets[-1])].reshape(-1, 2 * width)
    else:  # a null that holds bytes: the present values gathered
        starts = offsets[:-1][present].astype(np.int64)
        text = raw[starts[:, None] + np.arange(2 * width)]
    digits = _hex_digits()[text]
    if (digits == 255).any():
        return None
    out = np.zeros((n, width), np.uint8)
    out[present] = (digits[:, 0::2] << 4) | digits[:, 1::2]
    mask = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(width), n, [mask, pa.py_buffer(out)],
                                 null_count=int(n - present.sum()))


_MOST_TEXT = 2**31 - 1
"""The most bytes one string array holds (its offsets are int32)."""


def hex_texts(column: pa.ChunkedArray) -> list[pa.Array]:
    """A column of binary ids as chunks of lowercase hex text: each chunk's `hex_text`,
    a chunk whose text would pass `_MOST_TEXT` bytes cut into pieces that do not."""
    out = []
    for chunk in column.chunks:
        step = max(1, _MOST_TEXT // (2 * chunk.type.byte_width))
        out += [hex_text(chunk.slice(at, step)) for at in range(0, len(chunk), step)]
    return out


def hex_text(arr: pa.Array) -> pa.Array:
    """One chunk of binary ids as lowercase hex text (nulls stay null), of at most
    `_MOST_TEXT` bytes (`hex_texts` cuts a longer one)."""
    import numpy as np
    import pyarrow as pa

    n, width = len(arr), arr.type.byte_width
    if n == 0:
        return pa.array([], pa.string())
    if n * 2 * width > _MOST_TEXT:
        raise ValueError(f"{n:,} ids are more text than one string array holds; "
                         "hex_texts cuts them into chunks")
    present = validity(arr)
    data = arr.buffers()[1]
    raw = np.frombuffer(data, np.uint8)[arr.offset * width : (arr.offset + n) * width]
    text = _hex_pairs()[raw.reshape(n, width)[present]].view(np.uint8).reshape(-1)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.where(present, 2 * width, 0), out=offsets[1:])
    mask = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(pa.string(), n, [mask, pa.py_buffer(offsets),
                                                  pa.py_buffer(text.tobytes())],
                                 null_count=int(n - present.sum()))


def hex_words(raw: np.ndarray) -> np.ndarray:
    """8-byte ids (a ``(k, 8)`` uint8 array) as the two big-endian uint64 words of their
    16-digit lowercase hex text (``(k, 2)``): the words ``analysis`` reads from a version-1
    id column's text, so both versions give it equal words."""
    import numpy as np

    text = _hex_pairs()[raw].view(np.uint8).reshape(len(raw), 16)
    return np.ascontiguousarray(text).view(">u8").reshape(-1, 2)
