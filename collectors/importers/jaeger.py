"""Jaeger JSON: the UI's "Download JSON" and the query API's ``/api/traces`` response,
optionally gzip-compressed (up to `MAX_DECOMPRESSED_BYTES` decompressed).

The shape is Jaeger's ``model/json`` (``{"data": [trace, ...]}``; a single trace object or
a bare list of traces is accepted too). Conventions follow the OTLP path
(`ttft.collectors.otlp_receiver`):

* ids are lowercase hex, left-padded (a 64-bit trace id becomes 32 characters);
* the first ``CHILD_OF`` reference is the parent; ``FOLLOWS_FROM`` and further
  ``CHILD_OF`` references go under ``attributes["links"]``, each with its
  ``opentracing.ref_type`` as OpenTelemetry's Jaeger translator writes it;
* ``startTime``/``duration``/log ``timestamp`` are µs, stored as epoch ns;
* tags become attributes (typed values); ``ttft.stage``, ``ttft.request_id`` /
  ``request_id`` and ``ttft.clock`` are taken out by `ttft_fields`;
* ``service`` is the process's ``serviceName``; ``clock`` is the span's ``ttft.clock``,
  else the process's ``ttft.clock``, else ``host:<hostname>`` (process tag ``hostname``,
  ``host.name`` or ``ip``), else ``host:<service>``;
* a log with an ``event`` field is a point-event row (child of its span, the other fields
  its attributes, span id derived from the span's id and the log's index); other logs go
  under ``attributes["logs"]``; a span that is itself a point keeps its event logs under
  ``attributes["events"]``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from ttft.collectors._spans import ttft_fields
from ttft.collectors.errors import TraceFileError
from ttft.collectors.importers._base import (
    decoded_head,
    fits_int64,
    load_json,
    read_bytes,
    rows_to_table,
)
from ttft.collectors.rows import event_span_id
from ttft.tracer.schema import ATTR_CLOCK

_HOST_TAGS = ("hostname", "host.name", "ip")
_HEX = re.compile(r"[0-9a-fA-F]+")


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class _Bad(Exception):
    """A malformed element; ``where`` names it (``data[0].spans[3].tags[1]``)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")


class JaegerJSON:
    name = "jaeger"
    description = "Jaeger JSON (UI download or /api/traces response)"

    def guess_can_open(self, path: Path) -> bool:
        data = decoded_head(path, 4096)[0].lstrip(b"\xef\xbb\xbf \t\r\n")
        return (
            data[:1] in (b"{", b"[")
            and b'"traceID"' in data
            and (b'"spans"' in data or b'"operationName"' in data)
        ) or _empty_answer(data)

    def read(self, path: Path) -> pa.Table:
        document = load_json(read_bytes(path), path)
        errors = _errors(document)
        if errors and not document.get("data"):
            more = f"; and {len(errors) - 5:,} more" if len(errors) > 5 else ""
            raise TraceFileError(path, "the Jaeger query answered with errors and no trace: "
                                 + "; ".join(errors[:5]) + more)
        rows: list[dict[str, Any]] = []
        try:
            for where, trace in _traces(document):
                rows.extend(_trace_rows(trace, where))
        except _Bad as exc:
            raise TraceFileError(path, str(exc)) from None
        except RecursionError:
            raise TraceFileError(path, "a tag value is nested too deeply") from None
        # Traces the answer holds are kept; what it could not find is said in the metadata.
        return rows_to_table(rows, path, self.name, **({"query_errors": errors} if errors else {}))


def _traces(document: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(document, dict) and "data" in document:
        traces, prefix = document["data"], "data"
    elif isinstance(document, dict):
        traces, prefix = [document], None
    else:
        traces, prefix = document, ""
    if not isinstance(traces, list):
        raise _Bad(prefix or "document", "expected a list of traces")
    for index, trace in enumerate(traces):
        where = "trace" if prefix is None else f"{prefix}[{index}]"
        if not isinstance(trace, dict) or not isinstance(trace.get("spans"), list):
            raise _Bad(where, "expected a trace object with a 'spans' list")
        yield where, trace


def _trace_rows(trace: dict[str, Any], where: str) -> list[dict[str, Any]]:
    processes = trace.get("processes") or {}
    if not isinstance(processes, dict):
        raise _Bad(f"{where}.processes", "expected an object")
    rows: list[dict[str, Any]] = []
    for index, span in enumerate(trace["spans"]):
        at = f"{where}.spans[{index}]"
        if not isinstance(span, dict):
            raise _Bad(at, "expected a span object")
        rows.extend(_span_rows(span, trace, processes, at))
    return rows


def _span_rows(
    span: dict[str, Any], trace: dict[str, Any], processes: dict[str, Any], at: str
) -> list[dict[str, Any]]:
    trace_id = _hex_id(span.get("traceID", trace.get("traceID")), 32, f"{at}.traceID")
    span_id = _hex_id(span.get("spanID"), 16, f"{at}.spanID")
    service, process_tags = _process(span, processes, at)
    start_ns = _ns(span.get("startTime"), f"{at}.startTime")
    end_ns = start_ns + _ns(span.get("duration", 0), f"{at}.duration")
    if not fits_int64(end_ns):
        raise _Bad(f"{at}.duration", "the span ends beyond the int64 ns range")
    if end_ns < start_ns:
        raise _Bad(f"{at}.duration", f"negative duration {span.get('duration')!r}")
    name = span.get("operationName")
    if not isinstance(name, str):
        raise _Bad(f"{at}.operationName", f"expected a string, got {name!r}")

    attributes = _tags(span.get("tags"), f"{at}.tags")
    stage, request_id, clock, point = ttft_fields(name, attributes, start_ns, end_ns)
    if clock is None:
        clock = process_tags.get(ATTR_CLOCK)
    if clock is None:
        host = next((process_tags[k] for k in _HOST_TAGS if process_tags.get(k)), service)
        clock = f"host:{host}"
    parent_id, links = _references(span.get("references"), f"{at}.references")
    if links:
        attributes["links"] = links
    for key in ("flags", "warnings"):
        if span.get(key):
            attributes[f"jaeger.{key}"] = span[key]

    common = {
        "trace_id": trace_id,
        "request_id": None if request_id is None else str(request_id),
        "clock": str(clock),
        "service": service,
    }
    events: list[dict[str, Any]] = []
    logs: list[dict[str, Any]] = []
    for index, log in enumerate(span.get("logs") or ()):
        log_at = f"{at}.logs[{index}]"
        if not isinstance(log, dict):
            raise _Bad(log_at, "expected a log object")
        timestamp_ns = _ns(log.get("timestamp"), f"{log_at}.timestamp")
        fields = _tags(log.get("fields"), f"{log_at}.fields")
        if "event" not in fields:
            logs.append({"timestamp_ns": timestamp_ns, "fields": fields})
            continue
        event_name = str(fields.pop("event"))
        if point:
            events.append({"name": event_name, "timestamp_ns": timestamp_ns,
                           "attributes": fields})
            continue
        events.append({**common, "span_id": event_span_id(span_id, index),
                       "parent_id": span_id, "name": event_name, "stage": "event",
                       "start_ns": timestamp_ns, "end_ns": timestamp_ns,
                       "attributes": _json(fields)})
    if logs:
        attributes["logs"] = logs
    if point and events:
        attributes["events"] = events
        events = []
    row = {**common, "span_id": span_id, "parent_id": parent_id, "name": name,
           "stage": stage, "start_ns": start_ns, "end_ns": end_ns,
           "attributes": _json(attributes)}
    return [row, *events]


def _process(
    span: dict[str, Any], processes: dict[str, Any], at: str
) -> tuple[str, dict[str, Any]]:
    """The span's service name and process tags (from ``processID``, or an inline
    ``process`` as some exporters write it)."""
    process = span.get("process")
    where = f"{at}.process"
    if process is None and "processID" in span:
        process = processes.get(span["processID"])
        where = f"processes[{span['processID']!r}]"
        if process is None:
            raise _Bad(f"{at}.processID", f"no process {span['processID']!r} in 'processes'")
    if process is None:
        return "unknown_service", {}
    if not isinstance(process, dict):
        raise _Bad(where, "expected a process object")
    service = process.get("serviceName")
    return str(service or "unknown_service"), _tags(process.get("tags"), f"{where}.tags")


def _references(refs: Any, at: str) -> tuple[str | None, list[dict[str, Any]]]:
    parent_id = None
    links: list[dict[str, Any]] = []
    for index, ref in enumerate(refs or ()):
        ref_at = f"{at}[{index}]"
        if not isinstance(ref, dict):
            raise _Bad(ref_at, "expected a reference object")
        ref_type = ref.get("refType", "CHILD_OF")
        if ref_type not in ("CHILD_OF", "FOLLOWS_FROM"):
            raise _Bad(f"{ref_at}.refType", f"expected CHILD_OF or FOLLOWS_FROM, got {ref_type!r}")
        span_id = _hex_id(ref.get("spanID"), 16, f"{ref_at}.spanID")
        if ref_type == "CHILD_OF" and parent_id is None:
            parent_id = span_id
            continue
        links.append({"trace_id": _hex_id(ref.get("traceID"), 32, f"{ref_at}.traceID"),
                      "span_id": span_id,
                      "attributes": {"opentracing.ref_type": ref_type.lower()}})
    return parent_id, links


def _tags(tags: Any, at: str) -> dict[str, Any]:
    if tags is None:
        return {}
    if not isinstance(tags, list):
        raise _Bad(at, "expected a list of {key, type, value}")
    out: dict[str, Any] = {}
    for index, tag in enumerate(tags):
        if not isinstance(tag, dict) or not isinstance(tag.get("key"), str):
            raise _Bad(f"{at}[{index}]", "expected a {key, type, value} object")
        out[tag["key"]] = _typed(tag.get("type"), tag.get("value"), f"{at}[{index}].value")
    return out


def _typed(kind: Any, value: Any, at: str) -> Any:
    """A tag value as its declared type (some writers quote numbers and booleans); binary
    values stay as written (base64)."""
    try:
        if kind == "bool" and isinstance(value, str):
            if value.lower() not in ("true", "false"):
                raise ValueError
            return value.lower() == "true"
        if kind == "int64" and not isinstance(value, bool):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if kind == "float64" and not isinstance(value, bool):
            return float(value)
    except (TypeError, ValueError):
        raise _Bad(at, f"{value!r} is not a valid {kind} value") from None
    return value


def _hex_id(value: Any, width: int, at: str) -> str:
    if not isinstance(value, str) or not _HEX.fullmatch(value) or len(value) > width:
        raise _Bad(at, f"expected a hex id of at most {width} digits, got {value!r}")
    if not value.strip("0"):
        raise _Bad(at, f"expected a non-zero id, got {value!r}")
    return value.lower().rjust(width, "0")


def _ns(value_us: Any, at: str) -> int:
    if isinstance(value_us, bool) or not isinstance(value_us, (int, float)):
        raise _Bad(at, f"expected microseconds as a number, got {value_us!r}")
    if isinstance(value_us, float) and (value_us != value_us or value_us in (
            float("inf"), float("-inf"))):
        raise _Bad(at, f"expected a finite number, got {value_us!r}")
    value_ns = value_us * 1000 if isinstance(value_us, int) else round(value_us * 1000)
    if not fits_int64(value_ns):
        raise _Bad(at, f"{value_us!r} µs is beyond the int64 ns range")
    return value_ns


_ANSWER_KEYS = frozenset(("data", "total", "limit", "offset", "errors"))
_LONG_ANSWER = re.compile(rb'\{\s*"data"\s*:\s*(null|\[\s*\])\s*,\s*"total"\s*:\s*\d+\s*,')


def _empty_answer(head: bytes) -> bool:
    """Whether ``head`` is the whole of an answer of the query API without traces: matched
    none (``{"data": [], "total": 0, ...}``) or failed (``"data": null`` and ``errors``).
    Nothing in it names Jaeger but its shape, so every key must be one of the answer's."""
    if not head.startswith(b"{"):
        return False
    if len(head) >= 4096:  # too long to parse here: the answer's own opening, as Jaeger writes it
        return _LONG_ANSWER.match(head) is not None
    try:
        document = json.loads(head)
    except ValueError:
        return False
    if not isinstance(document, dict) or not document.keys() <= _ANSWER_KEYS:
        return False
    return isinstance(document.get("total"), int) and (
        document.get("data") == [] or (document.get("data") is None and bool(_errors(document))))


def _errors(document: Any) -> list[str]:
    """The ``errors`` of a query answer, each as ``code N: message`` (none: an empty list)."""
    errors = document.get("errors") if isinstance(document, dict) else None
    if not isinstance(errors, list):
        return []
    out = []
    for error in errors:
        if isinstance(error, dict):
            code, message = error.get("code"), error.get("msg", error.get("message", ""))
            text = f"code {code}: {message}" if code is not None else str(message)
            trace_id = error.get("traceID")
            out.append(text if trace_id is None else f"{text} (trace {trace_id})")
        else:
            out.append(str(error))
    return out
