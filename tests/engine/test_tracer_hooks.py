"""The tracer functions the engine nests and links its spans with: ``request_parent``
(the span a request's new stages nest under, from its own task or another thread),
``new_request_root`` (a trace for a request with no open span) and ``add_link``."""

from __future__ import annotations

import threading

import ttft.tracer as tt
from ttft.tracer.api import add_link
from ttft.tracer.context import new_request_root, request_parent


def from_thread(fn):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_request_parent_is_the_current_span_of_the_request_else_its_registered_one():
    assert request_parent("r") is None
    with tt.request_context(None, "r") as root:
        assert request_parent("r") is root
        assert from_thread(lambda: request_parent("r")) is root
        with tt.stage("server") as server:
            with tt.stage("inner") as inner:
                assert request_parent("r") is inner  # this task's current span
                assert from_thread(lambda: request_parent("r")) is inner  # the registry
            assert from_thread(lambda: request_parent("r")) is server
            with tt.stage("other work", request_id="other"):
                assert request_parent("r") is server  # the current span is another request's
            assert request_parent("other") is None
    assert request_parent("r") is None
    assert from_thread(lambda: request_parent("r")) is None


def test_new_request_root_starts_a_trace_without_a_span_and_registers_nothing():
    a, b = new_request_root("r"), new_request_root("r")
    assert (a.span_id, a.request_id, a.remote) == (0, "r", False)
    assert a.trace_id != b.trace_id and a.trace_id > 0
    assert request_parent("r") is None


def test_add_link_links_spans_only(collect):
    exporter, tracing = collect
    with tt.request_context(None, "r") as root, tt.stage("server") as server:
        pass
    with tt.stage("step") as step:
        assert add_link(step, server, request_id="r") is True
        assert add_link(step, root) is False  # a trace root has no span to link to
        assert add_link(step, None) is False
    tracing.flush()
    (exported,) = [s for s in exporter.spans if s.name == "step"]
    links = [(link.context.span_id, dict(link.attributes)) for link in exported.links]
    assert links == [(server.span_id, {"request_id": "r"})]
    assert exported.links[0].context.trace_id == server.trace_id


def test_a_span_without_links_exports_none(collect):
    exporter, tracing = collect
    with tt.stage("step") as step:
        add_link(step, None)
    tracing.flush()
    (exported,) = exporter.spans
    assert list(exported.links) == []
