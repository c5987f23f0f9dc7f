"""Vectorized columns for synthetic traces: ids (``rows.mix64``), hex strings, compact JSON."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ttft.collectors.rows import mix64

HEX4 = np.frombuffer("".join(f"{v:04x}" for v in range(65536)).encode(), np.uint32)


def json_object(fields: dict[str, np.ndarray | pa.Array]) -> pa.Array:
    """Compact JSON objects with sorted keys, one per row, as ``rows.attributes_json`` writes
    them: integers from arrays, JSON fragments from Arrow."""
    parts: list = []
    for i, (name, value) in enumerate(sorted(fields.items())):
        parts.append(("{" if i == 0 else ",") + json.dumps(name) + ":")
        parts.append(value if isinstance(value, pa.Array) else pa.array(value).cast(pa.string()))
    return pc.binary_join_element_wise(*parts, "}", "")


def request_ids(r: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise("cmpl-", pa.array(r).cast(pa.string()), "")


def id_lists(lo: np.ndarray, hi: np.ndarray) -> pa.Array:
    """JSON lists of the request ids of requests ``[lo, hi)``, one list per pair."""
    sizes = hi - lo
    offsets = np.zeros(len(lo) + 1, np.int64)
    offsets[1:] = np.cumsum(sizes)
    idx = np.arange(offsets[-1]) - np.repeat(offsets[:-1] - lo, sizes)
    quoted = pc.binary_join_element_wise('"', request_ids(idx), '"', "")
    lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), quoted)
    return pc.binary_join_element_wise("[", pc.binary_join(lists, ","), "]", "")


def repeat(value: str, size: int) -> pa.Array:
    return pa.repeat(value, size).cast(pa.string())


def key(seed: int, domain: int) -> int:
    """The key of one id domain (0: span ids, 1 and 2: the halves of trace ids) of a seed."""
    return mix64((seed * 4 + domain) % 2**64)


def trace_hex(entity: np.ndarray, seed: int) -> np.ndarray:
    low = mix64(entity ^ key(seed, 1))
    return np.concatenate([hex64(mix64(low ^ key(seed, 2))), hex64(low)], axis=1)


def hex64(x: np.ndarray) -> np.ndarray:
    """(n,) uint64 -> (n, 16) uint8 lowercase hex digits, most significant first."""
    return HEX4[x.astype(">u8").view(">u2")].view(np.uint8).reshape(len(x), 16)


def hex_strings(chars: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """Arrow strings from fixed-width characters; with ``valid``, ``chars`` holds only the
    valid rows and the others are null."""
    width = chars.shape[1]
    n = len(chars) if valid is None else len(valid)
    count = np.arange(n + 1) if valid is None else np.concatenate([[0], np.cumsum(valid)])
    offsets = pa.py_buffer((count * width).astype(np.int32))
    data = pa.py_buffer(np.ascontiguousarray(chars).reshape(-1))
    if valid is None:
        return pa.StringArray.from_buffers(n, offsets, data)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.StringArray.from_buffers(n, offsets, data, bitmap, int(n - valid.sum()))
