"""OTLP trace data → ttft span rows: the parsing and conversion every OTLP path shares.

The OTLP/HTTP and OTLP/gRPC receivers, ``ttft join`` and the OTLP file importers all read
an ``ExportTraceServiceRequest`` (wire-identical to ``TracesData``) with these functions, so
a span becomes the same rows whichever way it arrived (DESIGN.md, "The span record").
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from ttft.collectors.rows import Event, Link, span_rows
from ttft.tracer.schema import ATTR_CLOCK

__all__ = ["parse_json_request", "parse_proto_request", "request_to_rows"]

_STATUS_NAMES = {1: "OK", 2: "ERROR"}  # OTLP Status.StatusCode, as the SDK's StatusCode names
_ID_BYTES = {"traceId": 16, "trace_id": 16, "spanId": 8, "span_id": 8,
             "parentSpanId": 8, "parent_span_id": 8}
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
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
    """An OTLP/JSON ``ExportTraceServiceRequest`` (or ``TracesData``) → the message.

    Ids may be hex, as the OTLP JSON encoding and the OpenTelemetry Collector write them,
    or base64 (standard or URL-safe, padded or not), as protobuf's own JSON encoder writes
    them; each id is checked on its own: exactly 32 (trace) or 16 (span) hex digits is hex,
    anything else must be base64 of 16 or 8 bytes. An empty id stays empty (an empty
    ``parentSpanId`` is a root). Field names may be lowerCamelCase or snake_case, 64-bit
    integers strings or numbers, enums numbers or names; unknown fields are ignored. A
    ``dict`` argument is not modified.

    Raises:
        ValueError: not JSON, not an object, a bad id or a field that does not parse; the
            message reads ``not a valid OTLP/JSON ExportTraceServiceRequest: <why>`` and
            names the field (e.g. ``resourceSpans[0].scopeSpans[0].spans[2].traceId``).
    """
    try:
        document = json.loads(data) if isinstance(data, (bytes, bytearray, str)) else data
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"not a valid {_JSON_KIND}: {exc}") from exc
    if not isinstance(document, dict):
        raise ValueError(f"not a valid {_JSON_KIND}: a JSON {type(document).__name__}, "
                         "not an object")
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(_ids_to_base64(document), request, ignore_unknown_fields=True)
    except Exception as exc:  # ParseError, our ValueError, RecursionError, ...
        raise ValueError(f"not a valid {_JSON_KIND}: {exc}") from exc
    return request


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
           ) -> Iterator[tuple[dict[str, Any], str]]:
    """Copies of the objects listed under ``keys`` of ``parent``, put back in their place."""
    for key in keys:
        items = parent.get(key)
        if isinstance(items, list):
            copies = [dict(item) if isinstance(item, dict) else item for item in items]
            parent[key] = copies
            for index, item in enumerate(copies):
                if isinstance(item, dict):
                    yield item, f"{path}{key}[{index}]"


def _convert_ids(node: dict[str, Any], path: str) -> None:
    for key, size in _ID_BYTES.items():
        if key in node:
            node[key] = _id_to_base64(node[key], size, f"{path}.{key}")


def _ids_to_base64(document: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``document`` whose span and link ids are base64, as protobuf's JSON parser
    reads bytes (the OTLP JSON encoding writes them as hex)."""
    document = dict(document)
    for resource, r_path in _items(document, ("resourceSpans", "resource_spans"), ""):
        for scope, s_path in _items(resource, ("scopeSpans", "scope_spans"), r_path + "."):
            for span, span_path in _items(scope, ("spans",), s_path + "."):
                _convert_ids(span, span_path)
                for link, link_path in _items(span, ("links",), span_path + "."):
                    _convert_ids(link, link_path)
    return document


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
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _span_rows(span: Any, service: str, default_clock: str) -> list[dict[str, Any]]:
    if len(span.trace_id) != 16 or not any(span.trace_id):
        raise ValueError(f"span {span.name!r}: invalid trace id {span.trace_id.hex()!r}")
    if len(span.span_id) != 8 or not any(span.span_id):
        raise ValueError(f"span {span.name!r}: invalid span id {span.span_id.hex()!r}")
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

    Returns:
        The rows, and one message per span that was rejected (a missing or zero trace or
        span id, or an end before the start); the other spans are still converted.
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
