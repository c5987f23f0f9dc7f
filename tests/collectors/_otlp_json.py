"""OTLP/JSON Lines files for the stage-mapping tests: spans as a serving stack's OpenTelemetry
SDK exports them (one export request per service, the resource's ``service.name`` and
``host.name``, span events with their own times), read back through the real importer."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ttft.analysis.pipeline import Analysis, analyze
from ttft.collectors import read_spans

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
CLIENT = "loadgen"


@dataclass
class Span:
    """One span of trace ``trace``, times in ms after ``T0``; ``events``: ``(name, ms)`` or
    ``(name, ms, attributes)``."""

    span: int
    name: str
    start_ms: float
    end_ms: float
    parent: int | None = None
    service: str = "svc"
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple] = field(default_factory=list)
    trace: int = 1
    host: str = "node"


def client(span: int, first_token_ms: float, end_ms: float, *, trace: int = 1) -> Span:
    """ttft's client span (the load generator's, on the client clock) with its
    ``first_token`` event."""
    return Span(span, "client", 0, end_ms, service=CLIENT, trace=trace,
                attributes={"ttft.clock": "client", "outcome": "ok"},
                events=[("first_token", first_token_ms)])


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _attributes(attributes: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in attributes.items()]


def _ns(ms: float) -> str:
    return str(T0 + round(ms * MS))


def _span(s: Span) -> dict[str, Any]:
    out = {
        "traceId": format(s.trace, "032x"),
        "spanId": format(s.span, "016x"),
        "name": s.name,
        "kind": 2 if s.parent is None else 1,
        "startTimeUnixNano": _ns(s.start_ms),
        "endTimeUnixNano": _ns(s.end_ms),
        "attributes": _attributes(s.attributes),
        "events": [{"timeUnixNano": _ns(e[1]), "name": e[0],
                    "attributes": _attributes(e[2] if len(e) > 2 else {})} for e in s.events],
    }
    if s.parent is not None:
        out["parentSpanId"] = format(s.parent, "016x")
    return out


def write(path: Path, spans: list[Span]) -> Path:
    """``spans`` as OTLP/JSON Lines, one export request per (service, host), in first-seen
    order."""
    groups: dict[tuple[str, str], list[Span]] = {}
    for s in spans:
        groups.setdefault((s.service, s.host), []).append(s)
    lines = []
    for (service, host), members in groups.items():
        resource = {"attributes": _attributes({"service.name": service, "host.name": host})}
        lines.append(json.dumps({"resourceSpans": [{
            "resource": resource,
            "scopeSpans": [{"scope": {"name": "test"}, "spans": [_span(s) for s in members]}],
        }]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def analysed(path: Path, spans: list[Span], boundary: str | None = None) -> Analysis:
    """``spans`` written to ``path`` and read back as ``ttft analyze`` reads a file: the
    importer, the built-in stage mapping, then the one analysis."""
    return analyze(read_spans(write(path, spans)), boundary=boundary)


def parts_ms(analysis: Analysis, request: int = 0) -> tuple[dict[str, float], float]:
    """One request's nonzero attributed stages and its TTFT, in ms."""
    att = analysis.attribution
    got = {k: v / MS for k, v in att.attributed.iloc[request].items() if v}
    return got, att.requests["ttft_ns"].iloc[request] / MS
