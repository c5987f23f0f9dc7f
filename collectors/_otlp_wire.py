"""Protobuf wire-format primitives for the compiled OTLP walk (numba; private to
``collectors``): varints, fields, strict UTF-8, byte-string comparison, and the check of
nested ``AnyValue`` trees (see :mod:`ttft.collectors._otlp_scan`).

numba's cache keys a compiled function on its own file only: after editing this module,
touch ``_otlp_scan.py`` and ``_otlp_emit.py`` too, or their cached kernels keep the old
primitives (an installed release rewrites every file, so it never meets this)."""

from __future__ import annotations

import numpy as np
from numba import njit

VARINT, I64, LEN, I32 = 0, 1, 2, 5
"""The wire types the OTLP messages use (groups, 3 and 4, are never accepted)."""


@njit(cache=True, nogil=True)
def varint(data: np.ndarray, p: int, end: int) -> tuple[np.uint64, int]:
    """The varint at ``p`` and the position after it; position -1 if it is cut or longer
    than 64 bits."""
    value = np.uint64(0)
    shift = np.uint64(0)
    while p < end:
        byte = np.uint64(data[p])
        p += 1
        if shift == 63 and byte > 1:
            return np.uint64(0), -1
        value |= (byte & np.uint64(0x7F)) << shift
        if byte < 0x80:
            return value, p
        shift += np.uint64(7)
    return np.uint64(0), -1


@njit(cache=True, nogil=True)
def field(data: np.ndarray, p: int, end: int) -> tuple[int, int, int, int, np.uint64]:
    """The field at ``p``: (number, wire type, start, end of its value, varint value).
    A varint's start and end enclose its bytes; number -1 for what the walk leaves."""
    key, p = varint(data, p, end)
    if p < 0:
        return -1, 0, 0, 0, np.uint64(0)
    number = np.int64(key >> np.uint64(3))
    wire = np.int64(key & np.uint64(7))
    if number == 0:
        return -1, 0, 0, 0, np.uint64(0)
    if wire == VARINT:
        value, q = varint(data, p, end)
        if q < 0:
            return -1, 0, 0, 0, np.uint64(0)
        return number, wire, p, q, value
    if wire == I64 or wire == I32:
        q = p + (8 if wire == I64 else 4)
        if q > end:
            return -1, 0, 0, 0, np.uint64(0)
        value = np.uint64(0)
        for i in range(q - 1, p - 1, -1):
            value = (value << np.uint64(8)) | np.uint64(data[i])
        return number, wire, p, q, value
    if wire == LEN:
        length, p = varint(data, p, end)
        if p < 0 or length > np.uint64(end - p):
            return -1, 0, 0, 0, np.uint64(0)
        return number, wire, p, p + np.int64(length), np.uint64(0)
    return -1, 0, 0, 0, np.uint64(0)


@njit(cache=True, nogil=True)
def utf8_ok(data: np.ndarray, p: int, end: int) -> bool:
    """Whether ``data[p:end]`` is well-formed UTF-8 (no overlong forms, no surrogates,
    nothing past U+10FFFF), as Python's strict decoder requires."""
    while p < end:
        c = data[p]
        if c < 0x80:
            p += 1
            continue
        if 0xC2 <= c <= 0xDF:
            n = 1
        elif 0xE0 <= c <= 0xEF:
            n = 2
        elif 0xF0 <= c <= 0xF4:
            n = 3
        else:
            return False
        if p + n >= end:
            return False
        c1 = data[p + 1]
        if c1 & 0xC0 != 0x80:
            return False
        if c == 0xE0 and c1 < 0xA0 or c == 0xED and c1 > 0x9F:
            return False
        if c == 0xF0 and c1 < 0x90 or c == 0xF4 and c1 > 0x8F:
            return False
        for i in range(2, n + 1):
            if data[p + i] & 0xC0 != 0x80:
                return False
        p += n + 1
    return True


@njit(cache=True, nogil=True)
def same(data: np.ndarray, p: int, length: int, literal: np.ndarray) -> bool:
    if length != literal.size:
        return False
    for i in range(length):
        if data[p + i] != literal[i]:
            return False
    return True


@njit(cache=True, nogil=True)
def compare(data: np.ndarray, a: int, a_len: int, b: int, b_len: int) -> int:
    """-1, 0 or 1 as ``data[a:a+a_len]`` sorts before, with or after ``data[b:b+b_len]``."""
    for i in range(min(a_len, b_len)):
        if data[a + i] != data[b + i]:
            return -1 if data[a + i] < data[b + i] else 1
    return -1 if a_len < b_len else (1 if a_len > b_len else 0)


@njit(cache=True, nogil=True)
def _any_field(data: np.ndarray, number: int, wire: int, a: int, b: int) -> int:
    """A field of an ``AnyValue`` inside a tree: the kind of message it opens (1 an
    ``ArrayValue``, 3 a ``KeyValueList``), -1 for a scalar that parses, -2 for anything
    else."""
    if number == 1 and wire == LEN:
        return -1 if utf8_ok(data, a, b) else -2
    if number == 5 and wire == LEN:
        return 1
    if number == 6 and wire == LEN:
        return 3
    if (number == 7 and wire == LEN or number == 4 and wire == I64
            or (number == 2 or number == 3) and wire == VARINT):
        return -1
    return -2


@njit(cache=True, nogil=True)
def nested_ok(data: np.ndarray, p: int, end: int, kind: int) -> bool:
    """Whether an ``ArrayValue`` (``kind`` 1) or ``KeyValueList`` (3) body parses, every
    value in it at any depth (64 at most). The stack holds (kind, end, values seen) of each
    message open: 0 AnyValue, 1 ArrayValue, 2 KeyValue, 3 KeyValueList."""
    kinds = np.empty(64, np.int64)
    ends = np.empty(64, np.int64)
    seen = np.zeros(64, np.int64)
    kinds[0], ends[0], top = kind, end, 0
    while top >= 0:
        if p == ends[top]:
            top -= 1
            continue
        number, wire, a, b, _ = field(data, p, ends[top])
        if number < 0 or top == 63:
            return False
        p = b
        kind = kinds[top]
        if kind == 1 or kind == 3:  # repeated field 1: AnyValue or KeyValue
            child = (0 if kind == 1 else 2) if number == 1 and wire == LEN else -2
        elif kind == 2 and number == 1 and wire == LEN:  # a KeyValue's key
            child = -1 if utf8_ok(data, a, b) else -2
        else:  # a KeyValue's one value, or an AnyValue's one field
            seen[top] += 1
            if kind == 2:
                child = 0 if number == 2 and wire == LEN else -2
            else:
                child = _any_field(data, number, wire, a, b)
            if seen[top] > 1:
                return False
        if child == -2:
            return False
        if child >= 0:
            top += 1
            kinds[top], ends[top], seen[top], p = child, b, 0, a
    return True
