"""OTLP trace files, as the OpenTelemetry Collector's file exporter writes them.

``format: json`` is OTLP/JSON Lines: one ``ExportTraceServiceRequest`` (``TracesData``) per
line. ``format: proto`` writes each marshalled ``TracesData`` after its length, a 4-byte
big-endian unsigned integer (opentelemetry-collector-contrib
``exporter/fileexporter/file_writer.go``, ``exportMessageAsBuffer``). Either may be
gzip-compressed as a whole (``gzip`` after the fact), up to `MAX_DECOMPRESSED_BYTES`
decompressed; the Collector's own per-message
``compression: zstd`` is not read.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ttft.collectors.errors import TraceFileError
from ttft.collectors.importers._base import (
    MAX_DECOMPRESSED_BYTES,
    decoded_head,
    opened,
    rows_to_table,
)
from ttft.collectors.otlp_rows import parse_json_request, parse_proto_request, request_to_rows

__all__ = ["MAX_DECOMPRESSED_BYTES", "OTLPJsonLines", "OTLPProto"]

REJECTED_EXAMPLES = 3
"""Rejected-span messages kept as examples in a table's ``rejected`` metadata."""

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BOM = b"\xef\xbb\xbf"
_FIELD_1 = 0x0A  # field 1, length-delimited: ``resource_spans``; ``ResourceSpans.resource``
_FIELD_2 = 0x12  # tag of field 2, length-delimited: ``ResourceSpans.scope_spans``


class OTLPJsonLines:
    """OTLP/JSON Lines: one export request per line (the Collector's ``format: json``).

    Also reads a file that is one JSON object (pretty-printed) or a JSON array of them. Ids
    may be hex or base64, 64-bit integers strings or numbers
    (`ttft.collectors.otlp_rows.parse_json_request`).

    ``read`` stops at the first line that is not a valid export request and names it:
    analysis needs the whole file to be consistent, so a partly read file is an error, not
    a smaller trace. Spans that parse but cannot become rows (a zero id, an end before the
    start) are skipped and counted in the table metadata's ``rejected``
    (``{"count": n, "examples": [...]}``).
    """

    name = "otlp-json"
    description = "OTLP/JSON Lines (OpenTelemetry Collector file exporter, format: json)"

    def guess_can_open(self, path: Path) -> bool:
        data = decoded_head(path, 4096)[0].removeprefix(_BOM)
        return data.lstrip()[:1] in (b"{", b"[") and (
            b"resourceSpans" in data or b"resource_spans" in data)

    def read(self, path: Path) -> pa.Table:
        spans = _Spans()
        with opened(path) as stream:
            for where, document in _json_documents(stream, path):
                if document and not ("resourceSpans" in document or "resource_spans" in document):
                    keys = ", ".join(sorted(map(str, document))[:5])
                    raise TraceFileError(path, f"{where}: not an OTLP trace export (no "
                                                 f"resourceSpans; keys: {keys})")
                try:
                    spans.add(where, parse_json_request(document))
                except ValueError as exc:
                    raise TraceFileError(path, f"{where}: {exc}") from None
        return spans.table(path, self.name)


class OTLPProto:
    """OTLP protobuf: length-prefixed ``TracesData`` messages (the Collector's
    ``format: proto``), or a file that is exactly one unframed message.

    ``read`` stops at the first frame that is truncated or does not parse, and names it
    (analysis needs the whole file to be consistent). Spans that parse but cannot become
    rows are skipped and counted in the table metadata's ``rejected``, as for
    `OTLPJsonLines`.
    """

    name = "otlp-proto"
    description = ("OTLP protobuf (OpenTelemetry Collector file exporter, format: proto; "
                   "or one serialized ExportTraceServiceRequest)")

    def guess_can_open(self, path: Path) -> bool:
        data, total = decoded_head(path, 64 << 10)
        if len(data) >= 4:
            size = int.from_bytes(data[:4], "big")
            if (total is None or 4 + size <= total) and _starts_request(data[4:], size):
                return True
        return _starts_request(data, total)

    def read(self, path: Path) -> pa.Table:
        spans = _Spans()
        with opened(path) as stream:
            for where, payload in _messages(stream, path):
                if payload.startswith(_ZSTD_MAGIC):
                    raise TraceFileError(path, f"{where}: zstd-compressed (the Collector's "
                                                 "compression: zstd), which ttft does not read; "
                                                 "export uncompressed, or gzip the file")
                try:
                    spans.add(where, parse_proto_request(payload))
                except ValueError as exc:
                    raise TraceFileError(path, f"{where}: {exc}") from None
        return spans.table(path, self.name)


class _Spans:
    """Rows of the requests read so far, and the spans that could not become rows."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.requests = 0
        self.rejected = 0
        self.examples: list[str] = []

    def add(self, where: str, request: ExportTraceServiceRequest) -> None:
        rows, errors = request_to_rows(request)
        self.rows.extend(rows)
        self.requests += 1
        self.rejected += len(errors)
        room = REJECTED_EXAMPLES - len(self.examples)
        self.examples.extend(f"{where}: {error}" for error in errors[:max(room, 0)])

    def table(self, path: Path, source_format: str) -> pa.Table:
        return rows_to_table(self.rows, path, source_format, requests=self.requests,
                             rejected={"count": self.rejected, "examples": self.examples})


def _json_documents(stream: IO[bytes], path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, object)`` for each export request: per line, or of a whole-file document
    when the first line is not a JSON object on its own (pretty-printed, or an array)."""
    first = True
    for lineno, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            document = json.loads(line)
        except (ValueError, RecursionError) as exc:
            if first:
                yield from _whole_document(line + stream.read(), path, lineno - 1)
                return
            raise TraceFileError(path, f"line {lineno}: not JSON ({_json_error(exc)})"
                                   ) from None
        if first and not isinstance(document, dict):
            yield from _whole_document(line + stream.read(), path, lineno - 1)
            return
        first = False
        if not isinstance(document, dict):
            raise TraceFileError(path, f"line {lineno}: a JSON {_kind(document)}, not an "
                                         "export request object")
        yield f"line {lineno}", document


def _whole_document(data: bytes, path: Path, skipped_lines: int
                    ) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        where = (f"line {exc.lineno + skipped_lines}: " if isinstance(exc, json.JSONDecodeError)
                 else "")
        raise TraceFileError(path, f"{where}not JSON ({_json_error(exc)})") from None
    if isinstance(document, dict):
        yield "the document", document
        return
    if not isinstance(document, list):
        raise TraceFileError(path, f"a JSON {_kind(document)}, not OTLP/JSON")
    for index, item in enumerate(document):
        if not isinstance(item, dict):
            raise TraceFileError(path, f"element {index}: a JSON {_kind(item)}, not an "
                                         "export request object")
        yield f"element {index}", item


def _json_error(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg}, column {exc.colno}"
    return str(exc) or type(exc).__name__


def _kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _messages(stream: io.BufferedReader, path: Path) -> Iterator[tuple[str, bytes]]:
    """``(where, serialized request)`` for each frame, or the one unframed message."""
    source: IO[bytes] = stream
    if stream.peek(1)[:1] == bytes([_FIELD_1]):
        # A frame starts with its length's high byte (0x0A only for frames of 160 MiB or
        # more); a bare message starts with its first resource span's tag.
        data = stream.read()
        try:
            if parse_proto_request(data).resource_spans:
                yield "message", data
                return
        except ValueError:
            pass
        source = io.BytesIO(data)
    offset = 0
    index = 0
    while prefix := source.read(4):
        index += 1
        where = f"frame {index} (byte {offset})"
        if len(prefix) < 4:
            raise TraceFileError(path, f"{where}: truncated length prefix ({len(prefix)} of "
                                         "4 bytes)")
        size = int.from_bytes(prefix, "big")
        payload = source.read(size)
        if len(payload) < size:
            raise TraceFileError(path, f"{where}: truncated: {len(payload)} of {size} bytes")
        yield where, payload
        offset += 4 + size


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """The varint at ``pos`` and the position after it; None if it runs off the data."""
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None


def _starts_request(data: bytes, size: int | None) -> bool:
    """Whether ``data``, the start of a message of ``size`` bytes (None: unknown), reads as
    an export request with a resource span. A message wholly in view is parsed; else its
    first resource span's framing is checked, and its resource parsed when in view."""
    if size is not None and len(data) >= size:
        try:
            return bool(parse_proto_request(data[:size]).resource_spans)
        except ValueError:
            return False
    if data[:1] != bytes([_FIELD_1]) or (field := _varint(data, 1)) is None:
        return False
    length, start = field
    if size is not None and start + length > size:
        return False
    tag = data[start:start + 1]
    if tag == bytes([_FIELD_2]):
        return True
    if tag != bytes([_FIELD_1]) or (inner := _varint(data, start + 1)) is None:
        return False
    resource_length, resource_start = inner
    if resource_start + resource_length > start + length:
        return False
    if resource_start + resource_length > len(data):
        return True  # a resource larger than the head: the framing is all there is to see
    try:
        Resource.FromString(data[resource_start:resource_start + resource_length])
    except Exception:  # DecodeError
        return False
    return True
