"""OTLP trace data → ttft span rows: the parsing and conversion every OTLP path shares.

The OTLP/HTTP and OTLP/gRPC receivers, ``ttft join`` and the OTLP file importers all read
an ``ExportTraceServiceRequest`` (wire-identical to ``TracesData``) with these functions, so
a span becomes the same rows whichever way it arrived (docs/design.md, "The span record").
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterator
from typing import Any

from google.protobuf import json_format, unknown_fields
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from ttft.collectors.rows import Event, Link, span_rows
from ttft.tracer.schema import ATTR_CLOCK

__all__ = ["parse_json_export", "parse_json_request", "parse_proto_request", "request_to_rows"]

_STATUS_NAMES = {1: "OK", 2: "ERROR"}  # OTLP Status.StatusCode, as the SDK's StatusCode names
_ID_BYTES = {"traceId": 16, "trace_id": 16, "spanId": 8, "span_id": 8,
             "parentSpanId": 8, "parent_span_id": 8}
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_MAX_NS = (1 << 63) - 1  # the span schema's times are int64
_JSON_KIND = "OTLP/JSON ExportTraceServiceRequest"
_PROTO_KIND = "protobuf ExportTraceServiceRequest"


def parse_proto_request(data: bytes) -> ExportTraceServiceRequest:
    """A serialized ``ExportTraceServiceRequest`` (or ``TracesData``) → the message.

    Raises:
        ValueError: the bytes do not parse; the message reads ``not a valid protobuf
            ExportTraceServiceRequest: <why>``, so a caller may prefix its subject.
    """
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(data)
    except Exception as exc:  # DecodeError, RecursionError, ...
        raise ValueError(f"not a valid {_PROTO_KIND}: {exc}") from exc
    return request


def parse_json_request(data: bytes | str | dict[str, Any]) -> ExportTraceServiceRequest:
    """An OTLP/JSON ``ExportTraceServiceRequest`` (or ``TracesData``) → the message, strictly.

    As :func:`parse_json_export`, but one span that does not parse fails the whole document
    (a file importer names the line instead of dropping the span).

    Raises:
        ValueError: as :func:`parse_json_export`, or for the first span that does not parse;
            the message then names the field (e.g.
            ``resourceSpans[0].scopeSpans[0].spans[2].traceId: ...``).
    """
    request, rejected = parse_json_export(data)
    if rejected:
        raise ValueError(f"not a valid {_JSON_KIND}: {rejected[0]}")
    return request


def parse_json_export(data: bytes | str | dict[str, Any]
                      ) -> tuple[ExportTraceServiceRequest, list[str]]:
    """An OTLP/JSON ``ExportTraceServiceRequest`` (or ``TracesData``) → the message, keeping
    every span that parses.

    Ids may be hex, as the OTLP JSON encoding and the OpenTelemetry Collector write them,
    or base64 (standard or URL-safe, padded or not), as protobuf's own JSON encoder writes
    them; each id is checked on its own: exactly 32 (trace) or 16 (span) hex digits is hex,
    anything else must be base64 of 16 or 8 bytes. An empty id stays empty (an empty
    ``parentSpanId`` is a root). Field names may be lowerCamelCase or snake_case, 64-bit
    integers strings or numbers, enums numbers or names; unknown fields are ignored. A
    ``dict`` argument is not modified. Each span is parsed on its own: one with a bad id, a
    value out of range (a negative time) or a known field of the wrong JSON type
    (``"name": 5``, ``"startTimeUnixNano": {}``) is left out and described, so a request is
    kept or rejected span by span exactly as :func:`request_to_rows` treats protobuf.

    Returns:
        The message without the spans that do not parse, and one message per such span,
        naming its place and field (``resourceSpans[0].scopeSpans[0].spans[2].traceId:
        'abcd' is neither 32 hex digits nor base64 of 16 bytes``).

    Raises:
        ValueError: not JSON, not an object, or a part outside the spans (a resource, a
            scope, the lists themselves) that does not parse; the message reads ``not a
            valid OTLP/JSON ExportTraceServiceRequest: <why>``.
    """
    try:
        document = json.loads(data) if isinstance(data, (bytes, bytearray, str)) else data
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"not a valid {_JSON_KIND}: {exc}") from exc
    if not isinstance(document, dict):
        raise ValueError(f"not a valid {_JSON_KIND}: a JSON {type(document).__name__}, "
                         "not an object")
    skeleton, scopes = _without_spans(document)
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(skeleton, request, ignore_unknown_fields=True)
    except Exception as exc:  # ParseError, RecursionError, ...
        raise ValueError(f"not a valid {_JSON_KIND}: {exc}") from exc
    rejected: list[str] = []
    for (r_index, s_index), (spans, path) in scopes.items():
        into = request.resource_spans[r_index].scope_spans[s_index].spans
        for index, span in enumerate(spans):
            error = _parse_span(span, into, f"{path}spans[{index}]")
            if error is not None:
                rejected.append(error)
    return request, rejected


def _without_spans(document: dict[str, Any]
                   ) -> tuple[dict[str, Any], dict[tuple[int, int], tuple[list[Any], str]]]:
    """A copy of ``document`` whose scopes' span lists are taken out, and those lists by
    (resource, scope) index with their path. A ``spans`` that is not a list stays (and fails
    the parse of the copy)."""
    document = dict(document)
    scopes: dict[tuple[int, int], tuple[list[Any], str]] = {}
    for r_index, resource, r_path in _items(document, ("resourceSpans", "resource_spans"), ""):
        for s_index, scope, s_path in _items(resource, ("scopeSpans", "scope_spans"),
                                             r_path + "."):
            spans = scope.get("spans")
            if isinstance(spans, list):
                scopes[r_index, s_index] = (spans, s_path + ".")
                del scope["spans"]
    return document, scopes


def _parse_span(span: Any, into: Any, path: str) -> str | None:
    """Parse one OTLP/JSON span onto the end of ``into``; the reason it cannot be, or None."""
    if not isinstance(span, dict):
        return f"{path}: a JSON {type(span).__name__}, not a span object"
    try:
        span = dict(span)
        _convert_ids(span, path)
        for _, link, link_path in _items(span, ("links",), path + "."):
            _convert_ids(link, link_path)
    except ValueError as exc:
        return str(exc)
    message = into.add()
    try:
        json_format.ParseDict(span, message, ignore_unknown_fields=True)
    except Exception as exc:  # ParseError, RecursionError, ...
        del into[-1]
        return f"{path}: {exc}"
    return None


def _id_to_base64(value: Any, size: int, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: an id must be a string, not {type(value).__name__}")
    if not value:
        return value
    if len(value) == 2 * size and _HEX_DIGITS.issuperset(value):
        raw: bytes | None = bytes.fromhex(value)
    else:
        raw = _b64decode(value)
    if raw is None or len(raw) != size:
        shown = value if len(value) <= 48 else value[:45] + "..."
        raise ValueError(f"{where}: {shown!r} is neither {2 * size} hex digits nor base64 "
                         f"of {size} bytes")
    return base64.b64encode(raw).decode()


def _b64decode(value: str) -> bytes | None:
    text = value.rstrip("=").replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def _items(parent: dict[str, Any], keys: tuple[str, ...], path: str
           ) -> Iterator[tuple[int, dict[str, Any], str]]:
    """Index, copy and path of each object listed under ``keys`` of ``parent``; the copies
    are put back in their place."""
    for key in keys:
        items = parent.get(key)
        if isinstance(items, list):
            copies = [dict(item) if isinstance(item, dict) else item for item in items]
            parent[key] = copies
            for index, item in enumerate(copies):
                if isinstance(item, dict):
                    yield index, item, f"{path}{key}[{index}]"


def _convert_ids(node: dict[str, Any], path: str) -> None:
    for key, size in _ID_BYTES.items():
        if key in node:
            node[key] = _id_to_base64(node[key], size, f"{path}.{key}")


def _value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as a JSON-able value (bytes as base64, as OTLP/JSON writes them)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if kind == "double_value" and not math.isfinite(value.double_value):
        number = value.double_value
        return "NaN" if math.isnan(number) else "Infinity" if number > 0 else "-Infinity"
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _wire_type_errors(message: Any) -> list[str]:
    """Known fields of ``message`` that arrived with another wire type (protobuf keeps them
    as unknown fields and leaves the field empty)."""
    unknown = unknown_fields.UnknownFieldSet(message)
    if not len(unknown):
        return []
    known = message.DESCRIPTOR.fields_by_number
    return [f"field {known[field.field_number].name} has wire type {field.wire_type}"
            for field in unknown if field.field_number in known]


def _check_span(span: Any) -> None:
    """Raise ValueError naming the first reason ``span`` cannot be stored."""
    if len(span.trace_id) != 16 or not any(span.trace_id):
        raise ValueError(f"invalid trace id {span.trace_id.hex()!r}")
    if len(span.span_id) != 8 or not any(span.span_id):
        raise ValueError(f"invalid span id {span.span_id.hex()!r}")
    if len(span.parent_span_id) not in (0, 8):
        raise ValueError(f"invalid parent span id {span.parent_span_id.hex()!r}")
    for field in ("start_time_unix_nano", "end_time_unix_nano"):
        if getattr(span, field) > _MAX_NS:
            raise ValueError(f"{field} {getattr(span, field)} is beyond int64 nanoseconds "
                             "(2^63 - 1)")
    wrong = _wire_type_errors(span) + _wire_type_errors(span.status)
    for index, event in enumerate(span.events):
        if event.time_unix_nano > _MAX_NS:
            raise ValueError(f"events[{index}].time_unix_nano {event.time_unix_nano} is "
                             "beyond int64 nanoseconds (2^63 - 1)")
        wrong += _wire_type_errors(event)
    for link in span.links:
        if len(link.trace_id) != 16 or len(link.span_id) != 8:
            raise ValueError(f"invalid link ids {link.trace_id.hex()!r}/{link.span_id.hex()!r}")
        wrong += _wire_type_errors(link)
    if wrong:
        raise ValueError("; ".join(wrong))


def _span_rows(span: Any, service: str, default_clock: str) -> list[dict[str, Any]]:
    try:
        _check_span(span)
    except ValueError as exc:
        raise ValueError(f"span {span.name!r}: {exc}") from None
    return span_rows(
        span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex() or None,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano or span.start_time_unix_nano,
        clock=default_clock,
        service=service,
        attributes=_attributes(span.attributes),
        events=[Event(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in span.events],
        links=[Link(link.trace_id.hex(), link.span_id.hex(), _attributes(link.attributes))
               for link in span.links],
        status_code=_STATUS_NAMES.get(span.status.code),
        status_description=span.status.message,
    )


def request_to_rows(request: ExportTraceServiceRequest) -> tuple[list[dict[str, Any]], list[str]]:
    """Map every span of an OTLP export request onto span-record rows.

    Conventions are those of :func:`ttft.collectors.otel_exporter.span_to_rows`; ids become
    lowercase hex; ``service`` is the resource's ``service.name`` (``unknown_service`` if
    absent); ``clock`` is the span's ``ttft.clock``, else the resource's ``ttft.clock``, else
    ``host:<host.name>`` of the resource, else ``host:<service>``. Rows are built by
    :func:`ttft.collectors.rows.span_rows`: each event of a span becomes a point-event row
    whose span id is derived from the span's id and the event's index, so exporting the same
    span twice yields the same rows; links are kept in the attributes (``links``: trace id,
    span id and attributes of each).

    An attribute double that is NaN or infinite is stored as the string ``"NaN"``,
    ``"Infinity"`` or ``"-Infinity"`` (as protobuf's JSON encoding writes it), so the
    attributes stay valid JSON.

    Returns:
        The rows, and one message per span that was rejected, naming the span and why: a
        missing or zero trace or span id, an id of the wrong length (parent or link too), a
        time beyond int64 nanoseconds, a known field sent with the wrong protobuf wire type,
        or an end before the start. The other spans are still converted.
    """
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = str(resource.get("service.name") or "unknown_service")
        clock = resource.get(ATTR_CLOCK) or "host:" + str(resource.get("host.name") or service)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                try:
                    rows.extend(_span_rows(span, service, str(clock)))
                except ValueError as exc:
                    errors.append(str(exc))
    return rows, errors
