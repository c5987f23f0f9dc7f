"""A protobuf ``ExportTraceServiceRequest`` straight to a span table, compiled: the fast path
of every OTLP receiver (docs/design.md, "Receiving OTLP").

:func:`export_table` gives exactly the table ``to_span_table(request_to_rows(
parse_proto_request(body))[0])`` gives, row for row and byte for byte, for every body it
takes; a body it does not take (anything the reference would reject, in whole or in part,
and the rare shapes the compiled walk leaves: links, array or map values in a span's
attributes, a key given twice, ...) answers None, and the caller runs the reference, which
keeps its own errors and partial-success counts. Which path ran therefore never changes
what is stored or answered; ``tests/collectors/test_otlp_decode.py`` compares the two on
generated bodies and on every OTLP fixture.

The kernels are compiled once per machine (numba's cache); :func:`warm` loads them, and a
receiver calls it on a thread when it starts, answering with the reference until it is done.
``TTFT_OTLP_DECODER=reference`` in the environment keeps every receiver on the reference.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

__all__ = ["export_table", "ready", "warm", "warm_in_background"]

_state: dict[str, Any] = {}
_lock = threading.Lock()


def warm() -> bool:
    """Import and compile (or load from numba's cache) the kernels, once; whether they are
    usable (numba missing or failing leaves the reference path, logged once)."""
    with _lock:
        if "ok" not in _state and os.environ.get("TTFT_OTLP_DECODER") == "reference":
            _state["ok"] = False
        if "ok" not in _state:
            try:
                from ttft.collectors import _otlp_emit, _otlp_scan

                _state["scan"], _state["emit"] = _otlp_scan, _otlp_emit
                _state["ok"] = _agrees(_probe())
            except Exception:  # an import or compile failure: the reference still works
                import logging

                logging.getLogger(__name__).exception(
                    "compiled OTLP decoding unavailable; using the reference decoder")
                _state["ok"] = False
        return bool(_state["ok"])


def warm_in_background() -> None:
    """Start :func:`warm` on a daemon thread (once), so a receiver answers from its first
    request (with the reference decoder until the kernels are loaded)."""
    with _lock:
        if "thread" in _state:
            return
        _state["thread"] = threading.Thread(target=warm, daemon=True, name="ttft-otlp-warm")
    _state["thread"].start()


def _enable(enabled: bool) -> None:
    """Turn the compiled path on (warming it) or off, for measurements side by side."""
    if enabled:
        _state.pop("ok", None)
        warm()
    else:
        _state["ok"] = False


def ready() -> bool:
    """Whether :func:`warm` has made the kernels usable (never waits)."""
    return bool(_state.get("ok"))


def export_table(body: bytes, *, max_spans: int | None = None, _checked: bool = False
                 ) -> tuple[Any, int] | None:
    """The span table of a serialized export and its number of spans; None where the
    reference decoder must decide (see the module docstring), before :func:`warm` has
    finished, or for a body of more than ``max_spans`` spans."""
    if not _checked and not ready():
        return None
    import numpy as np

    scan = _state["scan"]
    data = np.frombuffer(body, np.uint8)
    cnt = np.zeros(4, np.int64)
    # one walk into tables sized for a typical export (a span takes at least 28 bytes); a
    # body denser than that is walked again into tables of the sizes counted
    limit = (1 << 62) if max_spans is None else max_spans
    sizes = (min(data.size // 28, limit) + 1, data.size // 8 + 16, data.size // 32 + 4, 8)
    for _ in range(2):
        sp = np.empty((sizes[0], scan.S_COLS), np.int64)
        kvs = np.empty((sizes[1] + 1, scan.K_COLS), np.int64)  # the last row: "none" (-1)
        kvs[-1] = (0, 0, scan.KIND_NULL, -1, 0)
        ev = np.empty((sizes[2], scan.E_COLS), np.int64)
        res = np.empty((sizes[3], scan.R_COLS), np.int64)
        order = np.empty(sizes[1], np.int64)
        found = scan.scan(data, data.size, True, sp, kvs[:-1], ev, res, order, cnt, limit)
        if found != scan.OVERFLOW:
            break
        sizes = tuple(int(n) for n in cnt)
    if found != 0:
        return None
    n_spans, n_kvs, n_events, n_resources = (int(n) for n in cnt)
    sp, ev, res, order = sp[:n_spans], ev[:n_events], res[:n_resources], order[:n_kvs]
    kvs = np.concatenate([kvs[:n_kvs], kvs[-1:]])
    table = _Columns(body, sp, kvs, ev, res, order).table()
    return None if table is None else (table, n_spans)


class _Columns:
    """Cuts the span columns out of a scanned body (the rules of ``rows.span_rows``)."""

    def __init__(self, body: bytes, sp: Any, kvs: Any, ev: Any, res: Any, order: Any) -> None:
        self.extra = bytearray()
        self.base = len(body)
        self.body = body
        self.sp, self.kvs, self.ev, self.res, self.order = sp, kvs, ev, res, order

    def _add(self, raw: bytes) -> int:
        """Offset in the data (the body and what is added after it) of ``raw``."""
        at = self.base + len(self.extra)
        self.extra += raw
        return at

    def _text(self, k: int) -> str:
        """The string value of key-value ``k`` ('' for none or an empty value)."""
        from ttft.collectors._otlp_scan import K_A, K_B, K_KIND, KIND_STR

        row = self.kvs[k]
        if k < 0 or row[K_KIND] != KIND_STR:
            return ""
        return self.body[row[K_A]:row[K_A] + row[K_B]].decode()

    def table(self) -> Any:
        import numpy as np
        import pyarrow as pa

        from ttft.collectors import _otlp_emit as emit
        from ttft.collectors import _otlp_scan as s
        from ttft.tracer.schema import SPAN_SCHEMA, STAGE_BY_NAME

        sp, kvs, ev = self.sp, self.kvs, self.ev
        n_spans = len(sp)
        # each resource's service and default clock (request_to_rows' rules)
        services: list[str] = []
        service_of, clocks = [], []
        for r in self.res:
            service = self._text(r[s.R_SERVICE]) or "unknown_service"
            if service not in services:
                services.append(service)
            service_of.append(services.index(service))
            clocks.append(self._text(r[s.R_CLOCK])
                          or "host:" + (self._text(r[s.R_HOST]) or service))
        clock_at = np.array([self._add(c.encode()) for c in clocks] or [0], np.int64)
        clock_len = np.array([len(c.encode()) for c in clocks] or [0], np.int64)
        # doubles, formatted by Python (as json.dumps writes a float; non-finite as the
        # string OTLP/JSON writes)
        doubles = np.flatnonzero(kvs[:, s.K_KIND] == s.KIND_DOUBLE)
        for k, value in zip(doubles, kvs[doubles, s.K_A].view(np.float64).tolist(),
                            strict=True):
            text = repr(value) if math.isfinite(value) else (
                '"NaN"' if math.isnan(value) else '"Infinity"' if value > 0 else '"-Infinity"')
            kvs[k, s.K_KIND], kvs[k, s.K_A], kvs[k, s.K_B] = s.KIND_RAW, self._add(
                text.encode()), len(text)
        # stages
        stage_names = list(STAGE_BY_NAME)
        names_raw = "".join(stage_names).encode()
        names_off = np.cumsum([0] + [len(n.encode()) for n in stage_names]).astype(np.int64)
        names = np.frombuffer(names_raw, np.uint8)
        lit = np.array([self._add(b"otel.status_code"), 16,
                        self._add(b"otel.status_description"), 23,
                        self._add(b"OK"), 2, self._add(b"ERROR"), 5], np.int64)
        data = np.frombuffer(bytes(self.body) + bytes(self.extra), np.uint8)
        other, event = stage_names.index("other"), stage_names.index("event")
        by_name = emit.find(data, sp[:, s.S_NAME], sp[:, s.S_NAME_LEN], names, names_off)
        stage_kv = sp[:, s.S_STAGE]
        explicit = stage_kv >= 0
        stated = emit.find(data, np.where(explicit, kvs[stage_kv, s.K_A], -1),
                           kvs[stage_kv, s.K_B], names, names_off)
        point_time = sp[:, s.S_START] == sp[:, s.S_END]
        stage = np.where(by_name < 0, other, by_name)
        stage = np.where(~explicit & (stage == other) & point_time, event, stage)
        stage = np.where(explicit, np.where(stated < 0, other, stated), stage)
        keep_stage = explicit & (stated < 0)
        has_events = sp[:, s.S_EV1] > sp[:, s.S_EV0]
        if np.any(has_events & ((stage == event) | point_time)):
            return None  # a point span keeps its events in its attributes: the reference
        # rows: each span, then its events
        n_rows = n_spans + len(ev)
        span_row = np.arange(n_spans) + sp[:, s.S_EV0]
        is_span = np.zeros(n_rows, bool)
        is_span[span_row] = True
        span_of = np.cumsum(is_span) - 1
        event_rows = np.flatnonzero(~is_span)
        event_index = np.full(n_rows, -1, np.int64)
        event_index[event_rows] = np.arange(len(ev)) - sp[span_of[event_rows], s.S_EV0]
        own = sp[span_of]
        events = ev[event_rows - span_of[event_rows] - 1]  # event e's row is its span's + e + 1

        def strings(at: Any, length: Any) -> Any:
            offsets = np.empty(len(at) + 1, np.int32)
            out = np.empty(int(np.where(at >= 0, length, 0).sum()), np.uint8)
            emit.gather(data, at, length, offsets, out)
            return _string_array(pa, offsets, out, at >= 0)

        def ids(at: Any, n_bytes: int, event_of: Any) -> Any:
            offsets = np.empty(len(at) + 1, np.int32)
            out = np.empty(int((at >= 0).sum()) * 2 * n_bytes, np.uint8)
            emit.hex_ids(data, at, n_bytes, event_of, offsets, out)
            return _string_array(pa, offsets, out, at >= 0)

        no_event = np.full(n_rows, -1, np.int64)
        trace_id = ids(own[:, s.S_TID], 16, no_event)
        span_id = ids(own[:, s.S_SID], 8, event_index)
        parent_id = ids(np.where(is_span, own[:, s.S_PID], own[:, s.S_SID]), 8, no_event)
        rid_kv = np.where(own[:, s.S_RID] >= 0, own[:, s.S_RID], own[:, s.S_RID2])
        request_id = strings(np.where(rid_kv >= 0, kvs[rid_kv, s.K_A], -1), kvs[rid_kv, s.K_B])
        name_at, name_len = own[:, s.S_NAME].copy(), own[:, s.S_NAME_LEN].copy()
        name_at[event_rows], name_len[event_rows] = events[:, s.E_NAME], events[:, s.E_NAME_LEN]
        name = strings(name_at, name_len)
        start, end = own[:, s.S_START].copy(), own[:, s.S_END].copy()
        start[event_rows] = end[event_rows] = events[:, s.E_TIME]
        clock_kv = own[:, s.S_CLOCK]
        resource = own[:, s.S_RES]
        clock = strings(np.where(clock_kv >= 0, kvs[clock_kv, s.K_A], clock_at[resource]),
                        np.where(clock_kv >= 0, kvs[clock_kv, s.K_B], clock_len[resource]))
        row_stage = np.full(n_rows, event, np.int64)
        row_stage[span_row] = stage
        # attributes: the span's but those taken out as columns; an event's own
        skip = np.full((n_rows, 4), -1, np.int64)
        skip[span_row, 0] = np.where(keep_stage, -1, stage_kv)
        skip[span_row, 1] = sp[:, s.S_RID]
        skip[span_row, 2] = np.where(sp[:, s.S_RID] >= 0, -1, sp[:, s.S_RID2])
        skip[span_row, 3] = sp[:, s.S_CLOCK]
        kv0, kv1 = own[:, s.S_KV0].copy(), own[:, s.S_KV1].copy()
        kv0[event_rows], kv1[event_rows] = events[:, s.E_KV0], events[:, s.E_KV1]
        code = np.where(is_span, own[:, s.S_CODE], 0)
        offsets = np.empty(n_rows + 1, np.int32)
        out = np.empty(6 * data.size + 128 * n_rows + 64 * len(kvs), np.uint8)
        used = emit.attributes_json(data, kvs, self.order, kv0, kv1, skip, code,
                                    own[:, s.S_MSG], own[:, s.S_MSG_LEN], lit, offsets, out)
        attributes = _string_array(pa, offsets, out[:used], None)
        columns = [
            trace_id, span_id, parent_id, request_id, name,
            _dictionary(pa, np, row_stage, stage_names),
            pa.array(start, pa.int64()), pa.array(end, pa.int64()),
            clock.dictionary_encode(),
            _dictionary(pa, np, np.array(service_of, np.int64)[resource], services),
            attributes,
        ]
        return pa.Table.from_arrays(columns, schema=SPAN_SCHEMA)


def _string_array(pa: Any, offsets: Any, data: Any, valid: Any) -> Any:
    import numpy as np

    mask = None
    nulls = 0
    if valid is not None and not valid.all():
        mask = pa.py_buffer(np.packbits(valid, bitorder="little"))
        nulls = int((~valid).sum())
    return pa.StringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets),
                                       pa.py_buffer(data), mask, nulls)


def _dictionary(pa: Any, np: Any, indices: Any, values: list[str]) -> Any:
    """A dictionary column of ``values[indices]``, its dictionary only the values used."""
    used, inverse = np.unique(indices, return_inverse=True)
    return pa.DictionaryArray.from_arrays(inverse.astype(np.int32),
                                          pa.array([values[i] for i in used], pa.string()))


def _probe() -> bytes:
    """A small export touching every kernel: attributes of each kind, ttft's own keys, an
    event, a status, two resources."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    for n in (1, 2):
        resource_spans = request.resource_spans.add()
        resource_spans.resource.attributes.add(key="service.name").value.string_value = "p"
        span = resource_spans.scope_spans.add().spans.add(name="prefill" if n == 1 else "x\u00e9")
        span.trace_id, span.span_id = bytes(15) + bytes([n]), bytes(7) + bytes([n])
        span.start_time_unix_nano, span.end_time_unix_nano = 10, 20
        for key, value in (("ttft.request_id", "r"), ("k\n", "\U0001f600"), ("ttft.stage", "s")):
            span.attributes.add(key=key).value.string_value = value
        span.attributes.add(key="i").value.int_value = -(1 << 63)
        span.attributes.add(key="d").value.double_value = 0.1
        span.attributes.add(key="b").value.bool_value = True
        span.events.add(name="e", time_unix_nano=15).attributes.add(key="z")
        span.status.code, span.status.message = n, "why"
    return request.SerializeToString()


def _agrees(body: bytes) -> bool:
    """Whether the compiled path gives the reference's rows for ``body``."""
    from ttft.collectors._spans import to_span_table
    from ttft.collectors.otlp_rows import parse_proto_request, request_to_rows

    found = export_table(body, _checked=True)
    rows, errors = request_to_rows(parse_proto_request(body))
    return (found is not None and not errors
            and found[0].to_pylist() == to_span_table(rows).to_pylist())
