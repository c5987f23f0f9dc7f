"""The row builder (``collectors/rows.py``): one span's rows, the point-event span-id rule
(scalar and vectorized alike), and the same rows from every producer: an SDK span through
the exporter and through OTLP, the load generator's client spans, the synthetic traces."""

from __future__ import annotations

import json
from types import MappingProxyType

import numpy as np
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link as OtelLink
from opentelemetry.trace import Status, StatusCode

from ttft.collectors._client_request import Request
from ttft.collectors.otel_exporter import span_to_rows
from ttft.collectors.otlp_rows import request_to_rows
from ttft.collectors.rows import (
    Event,
    Link,
    attributes_json,
    event_span_id,
    event_span_ids,
    span_rows,
)
from ttft.collectors.synthetic import generate

T0_NS = 1_700_000_000_000_000_000
TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
PARENT = "00f067aa0ba902b7"
U64 = st.integers(min_value=1, max_value=2**64 - 1)


def test_a_span_and_its_events_become_rows():
    rows = span_rows(
        "tokenize", trace_id=TRACE, span_id=SPAN, parent_id=PARENT, start_ns=T0_NS,
        end_ns=T0_NS + 10, clock="host:a", service="api",
        attributes={"ttft.request_id": "r1", "ttft.clock": "host:b", "n": 3, "raw": b"\0\1"},
        events=[Event("first_sampled", T0_NS + 4, {"token_id": 7}), Event("mark", T0_NS + 9)],
        links=[Link(TRACE, PARENT, {"why": "batched"})],
        status_code="ERROR", status_description="boom", request_id="ignored")
    common = {"trace_id": TRACE, "request_id": "r1", "clock": "host:b", "service": "api"}
    assert rows == [
        {**common, "span_id": SPAN, "parent_id": PARENT, "name": "tokenize",
         "stage": "tokenize", "start_ns": T0_NS, "end_ns": T0_NS + 10,
         "attributes": '{"links":[{"attributes":{"why":"batched"},"span_id":"00f067aa0ba902b7",'
                       '"trace_id":"0af7651916cd43dd8448eb211c80319c"}],"n":3,'
                       '"otel.status_code":"ERROR","otel.status_description":"boom",'
                       '"raw":"AAE="}'},
        {**common, "span_id": event_span_id(SPAN, 0), "parent_id": SPAN,
         "name": "first_sampled", "stage": "event", "start_ns": T0_NS + 4,
         "end_ns": T0_NS + 4, "attributes": '{"token_id":7}'},
        {**common, "span_id": event_span_id(SPAN, 1), "parent_id": SPAN, "name": "mark",
         "stage": "event", "start_ns": T0_NS + 9, "end_ns": T0_NS + 9, "attributes": "{}"},
    ]


def test_a_point_span_keeps_its_events_and_defaults_apply():
    attributes = {"bytes": 5}
    (row,) = span_rows("first_byte", trace_id=TRACE, span_id=SPAN, parent_id=None,
                       start_ns=T0_NS, end_ns=T0_NS, clock="host:a", service="api",
                       attributes=attributes, events=[Event("chunk", T0_NS, {"n": 1})],
                       request_id="r2")
    assert (row["stage"], row["request_id"], row["clock"], row["parent_id"]) == (
        "event", "r2", "host:a", None)
    assert json.loads(row["attributes"]) == {
        "bytes": 5, "events": [{"name": "chunk", "timestamp_ns": T0_NS, "attributes": {"n": 1}}]}
    assert attributes == {"bytes": 5}  # not modified


def test_a_span_that_ends_before_it_starts_is_refused():
    with pytest.raises(ValueError, match="'x' ends"):
        span_rows("x", trace_id=TRACE, span_id=SPAN, parent_id=None, start_ns=2, end_ns=1,
                  clock="c", service="s")


@given(st.lists(st.tuples(U64, st.integers(0, 10_000)), min_size=1, max_size=50))
def test_the_event_id_rule_is_one_rule_for_one_id_and_for_arrays(pairs):
    parents = np.array([p for p, _ in pairs], np.uint64)
    indices = np.array([i for _, i in pairs], np.uint64)
    vectorized = [format(int(x), "016x") for x in event_span_ids(parents, indices)]
    assert vectorized == [event_span_id(format(p, "016x"), i) for p, i in pairs]
    assert all(v != "0" * 16 for v in vectorized)


def test_event_ids_are_distinct_per_event_and_per_parent():
    ids = {event_span_id(format(p, "016x"), i) for p in range(1, 200) for i in range(20)}
    assert len(ids) == 199 * 20


def test_attributes_json_is_compact_sorted_and_total():
    value = {"b": b"\xff", "a": MappingProxyType({"z": 1}), "c": 1.5j}
    assert attributes_json(value) == '{"a":{"z":1},"b":"/w==","c":"1.5j"}'


def sdk_spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "api"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    root = tracer.start_span("server", start_time=T0_NS, attributes={"ttft.request_id": "r1"})
    child = tracer.start_span(
        "prefill.chunk", context=trace.set_span_in_context(root), start_time=T0_NS + 5,
        attributes={"step_id": 3, "request_ids": ("r1", "r2"), "ttft.clock": "gpu:0"},
        links=[OtelLink(root.get_span_context(), {"why": "batched"})])
    child.add_event("first_sampled", {"token_id": 42}, timestamp=T0_NS + 8)
    child.add_event("later", timestamp=T0_NS + 9)
    child.set_status(Status(StatusCode.ERROR, "boom"))
    child.end(end_time=T0_NS + 10)
    root.end(end_time=T0_NS + 20)
    provider.shutdown()
    return exporter.get_finished_spans()


def test_an_sdk_span_gives_the_same_rows_through_the_exporter_and_through_otlp():
    spans = sdk_spans()
    exported = [row for span in spans for row in span_to_rows(span, default_clock="host:h")]
    received, errors = request_to_rows(encode_spans(spans))
    assert errors == []
    # OTLP's default clock is the resource's host (none here: the service)
    for row in received:
        if row["clock"] == "host:api":
            row["clock"] = "host:h"
    assert sorted(received, key=lambda r: r["span_id"]) == sorted(
        exported, key=lambda r: r["span_id"])
    events = [row for row in exported if row["stage"] == "event"]
    chunk = next(row for row in exported if row["name"] == "prefill.chunk")
    assert [row["span_id"] for row in events] == [event_span_id(chunk["span_id"], i)
                                                  for i in range(2)]


def test_the_load_generators_events_follow_the_rule():
    req = Request(0, T0_NS)
    req.start_ns = T0_NS + 10
    req.on_sent(T0_NS + 11)
    req.on_headers(200, {}, T0_NS + 20)
    req.on_body(b'data: {"id":"r7","choices":[{"text":"Hi"}]}\n\ndata: [DONE]\n\n', T0_NS + 30)
    req.on_end(T0_NS + 31)
    rows = req.finish(T0_NS + 40).rows
    client, *events = rows
    assert client["stage"] == "client" and client["request_id"] == "r7"
    assert [(e["name"], e["start_ns"]) for e in events] == [
        ("scheduled", T0_NS), ("sent", T0_NS + 11), ("headers", T0_NS + 20),
        ("first_chunk", T0_NS + 30), ("first_event", T0_NS + 30), ("first_token", T0_NS + 30)]
    assert [e["span_id"] for e in events] == [event_span_id(client["span_id"], i)
                                              for i in range(len(events))]
    assert all(e["parent_id"] == client["span_id"] and e["request_id"] == "r7" for e in events)


def test_synthetic_traces_follow_the_rule_and_the_json_of_the_builder():
    table = generate(40, seed=2).table
    rows = table.to_pylist()
    assert all(attributes_json(json.loads(row["attributes"])) == row["attributes"]
               for row in rows)
    events = table.filter(pc.equal(table.column("stage"), "event")).to_pylist()
    children: dict[str, list[dict]] = {}
    for row in sorted(events, key=lambda row: row["start_ns"]):
        children.setdefault(row["parent_id"], []).append(row)
    for parent, evs in children.items():
        assert {e["span_id"] for e in evs} == {event_span_id(parent, i)
                                               for i in range(len(evs))}
