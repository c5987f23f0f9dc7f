"""The compiled walk of a protobuf ``ExportTraceServiceRequest`` (numba; private to
``collectors``): the body's bytes → tables of offsets into them, from which
:mod:`ttft.collectors.otlp_decode` cuts the span columns.

The walk is stricter than protobuf: it accepts only what it can prove the reference decoder
(``otlp_rows.parse_proto_request`` then ``request_to_rows``) turns into rows without a
rejection, and answers `BAIL` for anything else (an unknown field, a wire type or length it
does not expect, a field given twice, bad UTF-8, an id or time the reference rejects,
links, array or map values in a span's attributes, a duplicate attribute key, ...); the
caller then runs the reference on that body, so what is stored and what is rejected never
depends on which path ran (docs/design.md, "Receiving OTLP").

Tables (int64, one row per item, columns named by the ``S_*``, ``K_*``, ``E_*``, ``R_*``
constants): spans, key-values (of spans, events and resources), events, resources; and
``order``: each span's (and event's) key-value indices sorted by key (UTF-8 byte order,
which is code-point order, as ``json.dumps(sort_keys=True)`` sorts).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ttft.collectors._otlp_wire import (
    I32,
    I64,
    LEN,
    VARINT,
    compare,
    field,
    nested_ok,
    same,
    utf8_ok,
)

BAIL = -1
"""`scan`'s answer for a body the walk leaves to the reference decoder."""
OVERFLOW = -2
"""`scan`'s answer when a table it was given is too small for the body."""

_INT64_MAX = np.uint64(0x7FFFFFFFFFFFFFFF)

# spans
S_RES, S_TID, S_SID, S_PID, S_NAME, S_NAME_LEN, S_START, S_END = range(8)
S_KV0, S_KV1, S_EV0, S_EV1, S_CODE, S_MSG, S_MSG_LEN = range(8, 15)
S_STAGE, S_RID, S_RID2, S_CLOCK = range(15, 19)
S_COLS = 19
# key-values; a value is (kind, a, b): a string's offset and length, an int, a bool,
# a double's bits
K_KEY, K_KEY_LEN, K_KIND, K_A, K_B = range(5)
K_COLS = 5
KIND_NULL, KIND_STR, KIND_BOOL, KIND_INT, KIND_DOUBLE, KIND_RAW, KIND_OTHER = range(7)
# events
E_TIME, E_NAME, E_NAME_LEN, E_KV0, E_KV1 = range(5)
E_COLS = 5
# resources: key-value index of service.name, ttft.clock, host.name (-1: absent)
R_SERVICE, R_CLOCK, R_HOST = range(3)
R_COLS = 3

_STAGE = np.frombuffer(b"ttft.stage", np.uint8)
_RID = np.frombuffer(b"ttft.request_id", np.uint8)
_RID2 = np.frombuffer(b"request_id", np.uint8)
_CLOCK = np.frombuffer(b"ttft.clock", np.uint8)
_SERVICE = np.frombuffer(b"service.name", np.uint8)
_HOST = np.frombuffer(b"host.name", np.uint8)
_STATUS_KEY = np.frombuffer(b"otel.status_code", np.uint8)
_STATUS_MSG_KEY = np.frombuffer(b"otel.status_description", np.uint8)


@njit(cache=True, nogil=True)
def _any_value(data: np.ndarray, a: int, b: int, nested: bool) -> tuple[bool, int, int, int]:
    """An ``AnyValue`` at ``[a, b)``: (parses, kind, a, b); see `_keyvalue`."""
    if a == b:
        return True, KIND_NULL, 0, 0
    number, wire, a2, b2, value = field(data, a, b)
    if number < 0 or b2 != b:  # one value only (a oneof given twice is left)
        return False, 0, 0, 0
    if number == 1 and wire == LEN:
        return utf8_ok(data, a2, b2), KIND_STR, a2, b2 - a2
    if number == 2 and wire == VARINT:
        return True, KIND_BOOL, 1 if value != 0 else 0, 0
    if number == 3 and wire == VARINT:
        return True, KIND_INT, np.int64(value), 0
    if number == 4 and wire == I64:
        return True, KIND_DOUBLE, np.int64(value), 0
    if nested and number == 7 and wire == LEN:
        return True, KIND_OTHER, 0, 0
    if nested and (number == 5 or number == 6) and wire == LEN:
        return nested_ok(data, a2, b2, 1 if number == 5 else 3), KIND_OTHER, 0, 0
    return False, 0, 0, 0


@njit(cache=True, nogil=True)
def _keyvalue(data: np.ndarray, p: int, end: int, nested: bool
              ) -> tuple[bool, int, int, int, int, int]:
    """A ``KeyValue`` at ``[p, end)``: (parses, key offset, key length, kind, a, b). With
    ``nested``, array, map and bytes values are checked and given `KIND_OTHER`; else they
    are left to the reference."""
    key, key_len, kind, va, vb = p, 0, KIND_NULL, 0, 0
    keyed = valued = False
    while p < end:
        number, wire, a, b, _ = field(data, p, end)
        if number < 0 or wire != LEN or number == 1 and keyed or number == 2 and valued:
            return False, 0, 0, 0, 0, 0
        p = b
        if number == 1:
            if not utf8_ok(data, a, b):
                return False, 0, 0, 0, 0, 0
            key, key_len, keyed = a, b - a, True
        elif number == 2:
            valued = True
            ok, kind, va, vb = _any_value(data, a, b, nested)
            if not ok:
                return False, 0, 0, 0, 0, 0
        else:
            return False, 0, 0, 0, 0, 0
    return True, key, key_len, kind, va, vb


@njit(cache=True, nogil=True)
def _put(kvs: np.ndarray, k: int, key: int, key_len: int, kind: int, va: int, vb: int
         ) -> None:
    kvs[k, K_KEY], kvs[k, K_KEY_LEN], kvs[k, K_KIND] = key, key_len, kind
    kvs[k, K_A], kvs[k, K_B] = va, vb


@njit(cache=True, nogil=True)
def _sorted_unique(data: np.ndarray, kvs: np.ndarray, order: np.ndarray, k0: int, k1: int
                   ) -> bool:
    """Sort ``order[k0:k1]`` (the indices ``k0..k1-1``) by key; whether no key repeats."""
    if k1 - k0 > 256:  # insertion sort; wider attribute sets are left to the reference
        return False
    for i in range(k0, k1):
        j = i
        while j > k0 and compare(data, kvs[order[j - 1], K_KEY], kvs[order[j - 1], K_KEY_LEN],
                                 kvs[i, K_KEY], kvs[i, K_KEY_LEN]) > 0:
            order[j] = order[j - 1]
            j -= 1
        order[j] = i
    for i in range(k0 + 1, k1):
        a, b = order[i - 1], order[i]
        if compare(data, kvs[a, K_KEY], kvs[a, K_KEY_LEN], kvs[b, K_KEY], kvs[b, K_KEY_LEN]) == 0:
            return False
    return True


@njit(cache=True, nogil=True)
def _resource(data: np.ndarray, p: int, end: int, r: int, fill: bool, kvs: np.ndarray,
              res: np.ndarray, cnt: np.ndarray) -> bool:
    """A ``Resource``: its attributes are checked; service.name, ttft.clock and host.name
    (strings or empty values; the last of each wins) are kept."""
    while p < end:
        number, wire, a, b, _ = field(data, p, end)
        if number < 0:
            return False
        p = b
        if number == 2 and wire == VARINT:
            continue
        if number != 1 or wire != LEN:
            return False
        ok, key, key_len, kind, va, vb = _keyvalue(data, a, b, True)
        if not ok:
            return False
        column = (R_SERVICE if same(data, key, key_len, _SERVICE) else
                  R_CLOCK if same(data, key, key_len, _CLOCK) else
                  R_HOST if same(data, key, key_len, _HOST) else -1)
        if column < 0:
            continue
        if kind != KIND_STR and kind != KIND_NULL:
            return False
        k = cnt[1]
        cnt[1] += 1
        if fill and k < kvs.shape[0] and r < res.shape[0]:
            _put(kvs, k, key, key_len, kind, va, vb)
            res[r, column] = k
    return True


@njit(cache=True, nogil=True)
def _scope(data: np.ndarray, p: int, end: int) -> bool:
    """An ``InstrumentationScope``: checked only."""
    while p < end:
        number, wire, a, b, _ = field(data, p, end)
        if number < 0:
            return False
        p = b
        if (number == 1 or number == 2) and wire == LEN:
            if not utf8_ok(data, a, b):
                return False
        elif number == 3 and wire == LEN:
            if not _keyvalue(data, a, b, True)[0]:
                return False
        elif number != 4 or wire != VARINT:
            return False
    return True


@njit(cache=True, nogil=True)
def _event(data: np.ndarray, p: int, end: int, fill: bool, kvs: np.ndarray, ev: np.ndarray,
           order: np.ndarray, cnt: np.ndarray) -> bool:
    e = cnt[2]
    cnt[2] += 1
    time, name, name_len, kv0, seen = 0, p, 0, cnt[1], 0
    while p < end:
        number, wire, a, b, value = field(data, p, end)
        if number < 0:
            return False
        p = b
        if number == 1 and wire == I64 and seen & 2 == 0:
            if value > _INT64_MAX:
                return False
            time, seen = np.int64(value), seen | 2
        elif number == 2 and wire == LEN and seen & 4 == 0:
            if not utf8_ok(data, a, b):
                return False
            name, name_len, seen = a, b - a, seen | 4
        elif number == 3 and wire == LEN:
            ok, key, key_len, kind, va, vb = _keyvalue(data, a, b, False)
            if not ok:
                return False
            k = cnt[1]
            cnt[1] += 1
            if fill and k < kvs.shape[0]:
                _put(kvs, k, key, key_len, kind, va, vb)
        elif number != 4 or wire != VARINT:
            return False
    if fill and e < ev.shape[0] and cnt[1] <= kvs.shape[0]:
        ev[e, E_TIME], ev[e, E_NAME], ev[e, E_NAME_LEN] = time, name, name_len
        ev[e, E_KV0], ev[e, E_KV1] = kv0, cnt[1]
        return _sorted_unique(data, kvs, order, kv0, cnt[1])
    return True


@njit(cache=True, nogil=True)
def _nonzero(data: np.ndarray, a: int, b: int) -> bool:
    for i in range(a, b):
        if data[i]:
            return True
    return False


@njit(cache=True, nogil=True)
def _status(data: np.ndarray, p: int, end: int) -> tuple[bool, int, int, int]:
    """A ``Status``: (parses, code, message offset, message length); codes other than 0,
    1 and 2 are left to the reference."""
    code, message, length = 0, p, 0
    while p < end:
        number, wire, a, b, value = field(data, p, end)
        if number < 0:
            return False, 0, 0, 0
        p = b
        if number == 2 and wire == LEN:
            if not utf8_ok(data, a, b):
                return False, 0, 0, 0
            message, length = a, b - a
        elif number == 3 and wire == VARINT and value <= 2:
            code = np.int64(value)
        else:
            return False, 0, 0, 0
    return True, code, message, length


@njit(cache=True, nogil=True)
def _span_scalar(data: np.ndarray, number: int, wire: int, a: int, b: int, value: np.uint64,
                 row: np.ndarray) -> bool:
    """One of a span's fields other than attributes, events and status, into ``row``."""
    if number == 1 and wire == LEN:
        row[S_TID] = a
        return b - a == 16 and _nonzero(data, a, b)
    if number == 2 and wire == LEN:
        row[S_SID] = a
        return b - a == 8 and _nonzero(data, a, b)
    if number == 4 and wire == LEN:
        row[S_PID] = a if b - a == 8 else -1
        return b - a == 8 or b == a
    if number == 5 and wire == LEN:
        row[S_NAME], row[S_NAME_LEN] = a, b - a
        return utf8_ok(data, a, b)
    if (number == 7 or number == 8) and wire == I64:
        row[S_START if number == 7 else S_END] = np.int64(value)
        return value <= _INT64_MAX
    if number == 3 and wire == LEN:
        return utf8_ok(data, a, b)
    return (number == 16 and wire == I32 or number == 6 and wire == VARINT
            or (number == 10 or number == 12 or number == 14) and wire == VARINT)


@njit(cache=True, nogil=True)
def _span_attribute(data: np.ndarray, a: int, b: int, fill: bool, kvs: np.ndarray,
                    row: np.ndarray, cnt: np.ndarray) -> bool:
    """One of a span's attributes; ttft's own keys (which must hold strings) are noted in
    ``row``, and the status keys the span's status would overwrite are left."""
    ok, key, key_len, kind, va, vb = _keyvalue(data, a, b, False)
    if not ok or same(data, key, key_len, _STATUS_KEY) or same(data, key, key_len,
                                                                 _STATUS_MSG_KEY):
        return False
    column = (S_STAGE if same(data, key, key_len, _STAGE) else
              S_RID if same(data, key, key_len, _RID) else
              S_RID2 if same(data, key, key_len, _RID2) else
              S_CLOCK if same(data, key, key_len, _CLOCK) else -1)
    if column >= 0 and kind != KIND_STR:
        return False
    k = cnt[1]
    cnt[1] += 1
    row[S_KV1] = cnt[1]
    if column >= 0:
        row[column] = k
    if fill and k < kvs.shape[0]:
        _put(kvs, k, key, key_len, kind, va, vb)
    return True


@njit(cache=True, nogil=True)
def _span(data: np.ndarray, p: int, end: int, r: int, fill: bool, sp: np.ndarray,
          kvs: np.ndarray, ev: np.ndarray, order: np.ndarray, cnt: np.ndarray,
          row: np.ndarray) -> bool:
    """A ``Span``, its row built in ``row`` (scratch, reused)."""
    row[:] = -1
    row[S_RES], row[S_NAME], row[S_NAME_LEN], row[S_START], row[S_END] = r, p, 0, 0, 0
    row[S_KV0], row[S_KV1], row[S_EV0] = cnt[1], cnt[1], cnt[2]
    row[S_CODE], row[S_MSG], row[S_MSG_LEN] = 0, p, 0
    s = cnt[0]
    cnt[0] += 1
    seen = 0
    while p < end:
        number, wire, a, b, value = field(data, p, end)
        if number < 0 or number > 16:
            return False
        p = b
        if seen & (1 << number) and number != 9 and number != 11:
            return False  # a field given twice (protobuf keeps the last; merges messages)
        seen |= 1 << number
        if number == 9 and wire == LEN:  # an attribute after an event: no serializer
            ok = seen & (1 << 11) == 0 and _span_attribute(data, a, b, fill, kvs, row, cnt)
        elif number == 11 and wire == LEN:
            ok = _event(data, a, b, fill, kvs, ev, order, cnt)
        elif number == 15 and wire == LEN:
            ok, row[S_CODE], row[S_MSG], row[S_MSG_LEN] = _status(data, a, b)
        else:  # links (13) are left too
            ok = _span_scalar(data, number, wire, a, b, value, row)
        if not ok:
            return False
    if row[S_END] == 0:
        row[S_END] = row[S_START]
    if row[S_TID] < 0 or row[S_SID] < 0 or row[S_END] < row[S_START]:
        return False
    row[S_EV1] = cnt[2]
    if fill and s < sp.shape[0] and row[S_KV1] <= kvs.shape[0]:
        sp[s] = row
        return _sorted_unique(data, kvs, order, row[S_KV0], row[S_KV1])
    return True


@njit(cache=True, nogil=True)
def _scope_spans(data: np.ndarray, p: int, end: int, r: int, fill: bool, sp: np.ndarray,
                 kvs: np.ndarray, ev: np.ndarray, order: np.ndarray, cnt: np.ndarray,
                 row: np.ndarray, limit: int) -> bool:
    scoped = False
    while p < end:
        number, wire, a, b, _ = field(data, p, end)
        if number < 0 or wire != LEN:
            return False
        p = b
        if number == 1 and not scoped:
            scoped = True
            if not _scope(data, a, b):
                return False
        elif number == 2:
            if cnt[0] >= limit or not _span(data, a, b, r, fill, sp, kvs, ev, order, cnt, row):
                return False
        elif number != 3 or not utf8_ok(data, a, b):
            return False
    return True


@njit(cache=True, nogil=True)
def scan(data: np.ndarray, end: int, fill: bool, sp: np.ndarray, kvs: np.ndarray,
         ev: np.ndarray, res: np.ndarray, order: np.ndarray, cnt: np.ndarray, limit: int
         ) -> int:
    """Walk ``data[:end]``, counting into ``cnt`` (spans, key-values, events, resources)
    and, with ``fill``, filling the tables. Returns 0; `BAIL` for a body left to the
    reference or holding more than ``limit`` spans (the walk stops there); `OVERFLOW`
    where a table was too small (nothing past its end is written or read; walk again with
    tables of the sizes counted)."""
    cnt[:] = 0
    row = np.empty(S_COLS, np.int64)
    p = 0
    while p < end:
        number, wire, a, b, _ = field(data, p, end)
        if number != 1 or wire != LEN:
            return BAIL
        p = b
        r = cnt[3]
        cnt[3] += 1
        if fill and r < res.shape[0]:
            res[r, :] = -1
        resourced = False
        q = a
        while q < b:
            n2, w2, a2, b2, _ = field(data, q, b)
            if n2 < 0 or w2 != LEN:
                return BAIL
            q = b2
            if n2 == 1 and not resourced:
                resourced = True
                if not _resource(data, a2, b2, r, fill, kvs, res, cnt):
                    return BAIL
            elif n2 == 2:
                if not _scope_spans(data, a2, b2, r, fill, sp, kvs, ev, order, cnt, row,
                                    limit):
                    return BAIL
            elif n2 != 3 or not utf8_ok(data, a2, b2):
                return BAIL
    if fill and (cnt[0] > sp.shape[0] or cnt[1] > kvs.shape[0] or cnt[2] > ev.shape[0]
                 or cnt[3] > res.shape[0]):
        return OVERFLOW
    return 0
