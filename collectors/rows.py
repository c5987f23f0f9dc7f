"""Span → span-schema rows: the one row builder every producer of span rows uses.

The OpenTelemetry SDK exporter, the OTLP conversion (receivers, ``ttft join``, OTLP file
importers), the load generator and the prefill profile turn each of their spans into rows
with :func:`span_rows`; the synthetic trace generator, which lays out columns with numpy,
derives its event span ids with :func:`event_span_ids` (the same rule, vectorized) and
writes its attributes as :func:`attributes_json` would. So one span becomes the same rows
whichever producer made it (docs/design.md, "The span record").

The rules:

- The span is one row. Attributes that name columns are taken out of the JSON
  (:func:`ttft_fields`: ``ttft.stage``, ``ttft.request_id`` else ``request_id``,
  ``ttft.clock``); links go under ``links`` and a status other than unset under
  ``otel.status_code``/``otel.status_description``; the rest is compact JSON with sorted
  keys (:func:`attributes_json`).
- Each event of the span is a point-event row: stage ``event``, the event's name, its time
  as both start and end, the span as parent, the span's trace id, request id, clock and
  service, and the span id ``event_span_id(span id, index of the event in the span)``, so
  exporting, receiving or importing the same span twice gives the same rows.
- A span that is itself a point event (stage ``event``, or ``start_ns == end_ns``) stays one
  row and keeps its events under its ``events`` attribute.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ttft.tracer.schema import ATTR_CLOCK, ATTR_REQUEST_ID, ATTR_STAGE, stage_of

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "Event",
    "Link",
    "attributes_json",
    "event_span_id",
    "event_span_ids",
    "mix64",
    "span_rows",
    "ttft_fields",
]

_NO_ATTRIBUTES: Mapping[str, Any] = MappingProxyType({})
_MASK_64 = (1 << 64) - 1
_EVENT_KEY = 0x6A09E667F3BCC909
"""Mixed into every event's index (the fraction of sqrt(2), as in SHA-512), so an event id
is no simple function of its parent's."""

_U64 = TypeVar("_U64", int, "np.ndarray")


class Event(NamedTuple):
    """A point in time inside a span (an OpenTelemetry span event)."""

    name: str
    time_ns: int
    attributes: Mapping[str, Any] = _NO_ATTRIBUTES


class Link(NamedTuple):
    """A span link: the linked span's ids (lowercase hex) and the link's attributes."""

    trace_id: str
    span_id: str
    attributes: Mapping[str, Any] = _NO_ATTRIBUTES


def mix64(x: _U64) -> _U64:
    """SplitMix64's finalizer, a bijection on 64-bit integers: of a Python int in
    ``[0, 2**64)`` or elementwise of a ``uint64`` array (which wraps as the masks do)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK_64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK_64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK_64
    return z ^ (z >> 31)


def _event_id(parent: _U64, index: _U64) -> _U64:
    z = mix64(parent ^ mix64(index ^ _EVENT_KEY))
    return z + (z == 0)  # 0 is no valid span id; 1 stands in (one input in 2**64)


def event_span_id(parent_span_id: str, index: int) -> str:
    """The span id of the point-event row of event ``index`` (0-based, in the span's order
    of events) of the span ``parent_span_id`` (16 hex digits): SplitMix64 of the parent's
    id xor SplitMix64 of the index xor a constant, as 16 lowercase hex digits, never zero.

    Deterministic, so the same span gives the same rows however often it is converted.
    """
    return format(_event_id(int(parent_span_id, 16), index), "016x")


def event_span_ids(parent_span_ids: np.ndarray, indices: np.ndarray | int) -> np.ndarray:
    """:func:`event_span_id` of many events at once: parents' span ids and the events'
    indices as ``uint64`` arrays (or one index for all), the ids as a ``uint64`` array."""
    import numpy as np

    return _event_id(np.asarray(parent_span_ids, np.uint64), np.asarray(indices, np.uint64))


def _json_default(value: object) -> object:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()  # as OTLP/JSON encodes bytes
    if isinstance(value, Mapping):
        return dict(value)
    return str(value)


def attributes_json(attributes: Mapping[str, Any]) -> str:
    """The ``attributes`` column's text: compact JSON, keys sorted; bytes as base64 (as
    OTLP/JSON writes them), other mappings as objects, anything else not JSON as ``str``."""
    return json.dumps(attributes, sort_keys=True, separators=(",", ":"), default=_json_default)


def ttft_fields(
    name: str, attributes: dict[str, Any], start_ns: int, end_ns: int
) -> tuple[str, Any, Any, bool]:
    """Take ttft's own span attributes out of ``attributes`` (in place): the stage
    (``ttft.stage``, else from the name; a zero-length span of unknown name is an event),
    the request id (``ttft.request_id``, else ``request_id``) and the clock
    (``ttft.clock``). An unknown ``ttft.stage`` maps to ``other`` and stays in the
    attributes. Returns ``(stage, request_id, clock, point)``, ``point`` true for a row
    that is a point event."""
    explicit_stage = attributes.pop(ATTR_STAGE, None)
    request_id = attributes.pop(ATTR_REQUEST_ID, None)
    if request_id is None:
        request_id = attributes.pop("request_id", None)
    clock = attributes.pop(ATTR_CLOCK, None)
    if explicit_stage is None:
        stage = stage_of(name)
        if stage == "other" and start_ns == end_ns:
            stage = "event"
    else:
        stage = stage_of(str(explicit_stage))
        if stage != explicit_stage:
            attributes[ATTR_STAGE] = explicit_stage  # unknown stage name: keep what was said
    return stage, request_id, clock, stage == "event" or start_ns == end_ns


def span_rows(
    name: str,
    *,
    trace_id: str,
    span_id: str,
    parent_id: str | None,
    start_ns: int,
    end_ns: int,
    clock: str,
    service: str,
    attributes: Mapping[str, Any] | None = None,
    events: Iterable[Event] = (),
    links: Iterable[Link] = (),
    status_code: str | None = None,
    status_description: str | None = None,
    request_id: str | None = None,
) -> list[dict[str, Any]]:
    """The span-schema rows of one span and its events (the rules in the module docstring).

    Args:
        name: the span's name, kept verbatim; its stage is ``ttft.stage``, else the name.
        trace_id, span_id, parent_id: lowercase hex (32, 16, 16 digits); ``parent_id``
            None for a root.
        start_ns, end_ns: the span's start and end, epoch ns in its clock domain.
        clock: the clock domain unless the attributes name one (``ttft.clock``).
        service: the emitting service.
        attributes: the span's attributes (not modified).
        events: the span's events, in the span's order (their index derives their ids).
        links: the span's links.
        status_code, status_description: ``OK`` or ``ERROR`` and its message; None (and
            an empty message) write nothing.
        request_id: the request id unless the attributes carry one.

    Returns:
        Row dicts keyed by column name, the span's row first.

    Raises:
        ValueError: ``end_ns`` before ``start_ns``.
    """
    if end_ns < start_ns:
        raise ValueError(f"span {name!r} ends ({end_ns}) before it starts ({start_ns})")
    attrs = dict(attributes or {})
    stage, own_request_id, own_clock, point = ttft_fields(name, attrs, start_ns, end_ns)
    if status_code is not None:
        attrs["otel.status_code"] = status_code
        if status_description:
            attrs["otel.status_description"] = status_description
    link_list = [{"trace_id": link.trace_id, "span_id": link.span_id,
                  "attributes": dict(link.attributes)} for link in links]
    if link_list:
        attrs["links"] = link_list
    event_list = list(events)
    if point and event_list:
        attrs["events"] = [{"name": e.name, "timestamp_ns": e.time_ns,
                            "attributes": dict(e.attributes)} for e in event_list]
    if own_request_id is not None:
        request_id = str(own_request_id)
    clock = clock if own_clock is None else str(own_clock)
    rows = [_row(trace_id, span_id, parent_id, request_id, name, stage, start_ns, end_ns,
                 clock, service, attrs)]
    if not point:
        rows.extend(
            _row(trace_id, event_span_id(span_id, index), span_id, request_id, event.name,
                 "event", event.time_ns, event.time_ns, clock, service, dict(event.attributes))
            for index, event in enumerate(event_list)
        )
    return rows


def _row(trace_id: str, span_id: str, parent_id: str | None, request_id: str | None, name: str,
         stage: str, start_ns: int, end_ns: int, clock: str, service: str,
         attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {"trace_id": trace_id, "span_id": span_id, "parent_id": parent_id,
            "request_id": request_id, "name": name, "stage": stage, "start_ns": start_ns,
            "end_ns": end_ns, "clock": clock, "service": service,
            "attributes": attributes_json(attributes)}
