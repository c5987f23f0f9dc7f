"""One large OTLP export as several small ones, so a receiver never holds a million parsed
spans and their rows at once (README, "Reliability and security": memory per request is
bounded by the chunk, not the request).

A protobuf ``ExportTraceServiceRequest`` is split on the wire: every ``ResourceSpans`` and
``ScopeSpans`` is walked field by field and its spans are regrouped, at most ``max_spans``
to a chunk, each chunk keeping every other field of its resource and scope (resource,
scope, schema URLs, unknown fields) byte for byte. Parsing the chunks therefore gives
exactly the spans, resources and scopes that parsing the whole body gives. Where the
walker meets what it does not handle (a group, a malformed length), the body is one chunk
and the protobuf parser gives its own verdict.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Union

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

if TYPE_CHECKING:
    import pyarrow as pa

from ttft.collectors.otlp_decode import export_table
from ttft.collectors.otlp_rows import parse_proto_request

Chunk = Union[ExportTraceServiceRequest, "tuple[pa.Table, int]"]
"""A chunk of an export: parsed, for the reference conversion, or already a span table (and
its number of spans) from the compiled path (:mod:`ttft.collectors.otlp_decode`)."""

__all__ = ["CHUNK_SPANS", "decoded_chunks", "decoded_message_chunks", "message_chunks",
           "parsed_chunks", "proto_chunks"]

CHUNK_SPANS = 16_384
"""Spans per chunk: about 15 MB of rows in flight per request, whatever its size."""

_LEN = 2  # the length-delimited wire type


_MAX_HEAD_FIELDS = 64
"""Fields a resource or scope may carry beside its spans before the walk leaves the body to
the parser (an exporter writes a handful: resource, scope, schema URL)."""


class _Unhandled(Exception):
    """Wire data the walker leaves to the protobuf parser."""


def _varint(data: memoryview, at: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= end or shift > 63:
            raise _Unhandled
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(data: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """``(field, wire type, entry start, value start, entry end)`` of each field."""
    at = start
    while at < end:
        entry = at
        key, at = _varint(data, at, end)
        if key >> 3 == 0:  # field 0 is no field: the parser rejects it at once, not a walk
            raise _Unhandled
        wire = key & 7
        if wire == 0:
            _, after = _varint(data, at, end)
        elif wire == 1:
            after = at + 8
        elif wire == _LEN:
            length, at = _varint(data, at, end)
            after = at + length
        elif wire == 5:
            after = at + 4
        else:  # groups (3, 4) and invalid wire types
            raise _Unhandled
        if after > end:
            raise _Unhandled
        yield key >> 3, wire, entry, at, after
        at = after


def _message(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | _LEN) + _encode_varint(len(payload)) + payload


_Plan = tuple[bytes, bytes, list[tuple[int, int]]]
"""A chunk to build: its resource's other fields, its scope's other fields, and the byte
ranges of its spans (adjacent spans merged, so a chunk costs a few ranges, not one per span)."""


def _plans(data: memoryview, max_spans: int) -> list[_Plan]:
    plans: list[_Plan] = []
    for field, wire, _, start, end in _fields(data, 0, len(data)):
        if (field, wire) != (1, _LEN):  # not a ResourceSpans: no exporter writes one, and
            raise _Unhandled  # the parser walks such fields at C speed, not one by one here
        resource: list[bytes] = []
        scopes: list[tuple[int, int]] = []
        for inner, inner_wire, entry, value, after in _fields(data, start, end):
            if (inner, inner_wire) == (2, _LEN):
                scopes.append((value, after))
            else:
                resource.append(bytes(data[entry:after]))
                if len(resource) > _MAX_HEAD_FIELDS:
                    raise _Unhandled
        head_of_resource = b"".join(resource)
        for scope_start, scope_end in scopes:
            scope: list[bytes] = []
            runs: list[tuple[int, int]] = []
            count = 0
            chunks: list[list[tuple[int, int]]] = []
            for inner, inner_wire, entry, _, after in _fields(data, scope_start, scope_end):
                if (inner, inner_wire) != (2, _LEN):
                    scope.append(bytes(data[entry:after]))
                    if len(scope) > _MAX_HEAD_FIELDS:  # no scope says this much of itself:
                        raise _Unhandled  # left whole to the parser, at its speed
                    continue
                if count == max_spans:
                    chunks.append(runs)
                    runs, count = [], 0
                if runs and runs[-1][1] == entry:
                    runs[-1] = (runs[-1][0], after)
                else:
                    runs.append((entry, after))
                count += 1
            if runs:
                chunks.append(runs)
            head = b"".join(scope)
            plans.extend((head_of_resource, head, group) for group in chunks)
    return plans


class ProtoChunks:
    """The chunks of one body, each serialized only when iterated to."""

    def __init__(self, body: bytes, plans: list[_Plan]) -> None:
        self._data = memoryview(body)
        self._plans = plans

    def __len__(self) -> int:
        return len(self._plans)

    def __iter__(self) -> Iterator[bytes]:
        for resource, head, runs in self._plans:
            spans = b"".join(self._data[a:b] for a, b in runs)
            yield _message(1, resource + _message(2, head + spans))


def message_chunks(request: ExportTraceServiceRequest, max_spans: int = CHUNK_SPANS
                   ) -> Iterator[ExportTraceServiceRequest]:
    """A parsed request (an OTLP/JSON one) as requests of at most ``max_spans`` spans."""
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for first in range(0, len(scope_spans.spans), max_spans):
                chunk = ExportTraceServiceRequest()
                target = chunk.resource_spans.add()
                target.resource.CopyFrom(resource_spans.resource)
                target.schema_url = resource_spans.schema_url
                scope = target.scope_spans.add()
                scope.scope.CopyFrom(scope_spans.scope)
                scope.schema_url = scope_spans.schema_url
                scope.spans.extend(scope_spans.spans[first:first + max_spans])
                yield chunk


def decoded_message_chunks(request: ExportTraceServiceRequest, max_spans: int = CHUNK_SPANS
                           ) -> Iterator[Chunk]:
    """A parsed request's chunks (:func:`message_chunks`; an OTLP/JSON one), each a span
    table where the compiled path takes it, else the chunk itself."""
    return (export_table(chunk.SerializeToString()) or chunk
            for chunk in message_chunks(request, max_spans))


def parsed_chunks(body: bytes, max_spans: int = CHUNK_SPANS
                  ) -> Iterator[ExportTraceServiceRequest]:
    """The checked chunks of a protobuf body (:func:`proto_chunks`), parsed one at a time.

    Raises:
        ValueError: the body does not parse (before anything is yielded).
    """
    chunks = proto_chunks(body, max_spans)
    return (parse_proto_request(chunk) for chunk in chunks)


def decoded_chunks(body: bytes, max_spans: int = CHUNK_SPANS) -> Iterator[Chunk]:
    """The chunks of a protobuf body: the whole body as one span table when the compiled
    path takes it (and it holds at most ``max_spans`` spans), else the checked chunks of
    :func:`proto_chunks`, each a table where the compiled path takes it and parsed where it
    does not.

    Raises:
        ValueError: the body does not parse (before anything is yielded).
    """
    whole = export_table(body, max_spans=max_spans)
    if whole is not None:
        return iter([whole])
    chunks = proto_chunks(body, max_spans)
    if len(chunks) == 1:  # the whole body, which the compiled path has just left
        return iter([parse_proto_request(body)])
    return (export_table(chunk) or parse_proto_request(chunk) for chunk in chunks)


def proto_chunks(body: bytes, max_spans: int = CHUNK_SPANS) -> ProtoChunks | list[bytes]:
    """``body`` split into serialized requests of at most ``max_spans`` spans each, every one
    checked to parse (so a body that fails to parse fails before any chunk is stored).

    Raises:
        ValueError: the body does not parse (as :func:`parse_proto_request` words it).
    """
    try:
        plans = _plans(memoryview(body), max_spans)
    except _Unhandled:
        plans = []
    if len(plans) <= 1:
        parse_proto_request(body)  # the parser's own verdict on the whole body
        return [body]
    chunks = ProtoChunks(body, plans)
    for chunk in chunks:
        parse_proto_request(chunk)
    return chunks
