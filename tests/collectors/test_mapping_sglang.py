"""SGLang's EPD encoder slice (``epd_encode``, sgl-project/sglang#25994) and its Mooncake
transfer tracing (sgl-project/sglang#23755): the transfer runs in a trace of its own, tied to
the request by value only (its root's ``rid`` is the hex bootstrap room the request's root
carries as ``bootstrap_room``), and joins the request (mappings.toml names the sources).
Read through the OTLP importer and the one analysis."""

from __future__ import annotations

import json

import pyarrow as pa
from _otlp_json import T0, Span, analysed, client, parts_ms

from ttft.collectors.importers.mapping import Rule, StageMapping, default_mapping
from ttft.tracer.schema import METADATA_KEY, SPAN_SCHEMA

RID, ROOM = "1a2b3c4d5e6f", "0x2a"


def epd_pd(*, room: str | None = ROOM, client_id: str | None = None):
    """One multimodal request over an encoder, a prefill and a decode server (ms): the
    request's trace (client, both request roots and their slices, the encoder's slice in
    it since the trace context reaches the encoder) and the Mooncake sender's trace."""
    request = {"rid": RID, "module": "sglang::request"}
    if room is not None:
        request["bootstrap_room"] = room
    first = client(1, 450, 500)
    if client_id is not None:
        first.attributes["ttft.request_id"] = client_id
    sender = {"rid": ROOM, "bootstrap_room": ROOM, "module": "sglang::mooncake"}
    p, d = {"service": "sglang", "host": "p"}, {"service": "sglang", "host": "d"}
    m = {"service": "sglang", "host": "p", "trace": 2}
    return [
        first,
        Span(2, "prefill Req 1a2b3c4d", 10, 440, parent=1, attributes=request, **p),
        Span(3, "tokenize", 12, 20, parent=2, **p),
        Span(4, "epd_encode", 20, 60, parent=2, service="sglang", host="enc"),
        Span(5, "prefill_bootstrap", 60, 70, parent=2, **p),
        Span(6, "prefill_waiting", 70, 100, parent=2, **p),
        Span(7, "prefill_forward", 100, 200, parent=2, **p),
        Span(8, "prefill_transfer_kv_cache", 200, 230, parent=2, **p),
        Span(9, "decode Req 1a2b3c4d", 15, 440, parent=1, attributes=request, **d),
        Span(10, "decode_transferred", 205, 260, parent=9, **d),
        Span(11, "decode_waiting", 260, 280, parent=9, **d),
        # the sender's trace: root from its creation (bootstrap) to the transfer's end
        Span(20, "Sender Req 0x2a", 58, 250, attributes=sender, **m),
        Span(21, "Scheduler [TP 0] (host:abcd1234 | pid:41)", 58, 205, parent=20, **m),
        Span(22, "mooncake_send", 199, 201, parent=21, **m),
        Span(23, "mooncake transfer worker 0 [TP 0] (host:abcd1234 | pid:42)", 200, 250,
             parent=20, **m),
        Span(24, "mooncake_worker_send", 200, 245, parent=23, **m),
        Span(25, "mooncake_worker_send_session", 201, 240, parent=24, **m),
    ]


# Client window [0, 450); the server window is the prefill root's [10, 440) (no first byte):
# network 10 + 10; tokenize; the encoder's slice [20, 60) prefill; the bootstrap and waiting
# queues; prefill_forward (prefill) until the scheduler hands the first chunk to Mooncake
# at 199; the transfer slices of both traces, whose union is [199, 260), kv_transfer; the
# decode node's queue; the request roots alone (server) the rest.
EXPECTED = {"network": 20, "server": 162, "tokenize": 8, "prefill": 139, "queue": 60,
            "kv_transfer": 61}


def test_the_transfer_trace_joins_its_request_and_the_encoder_is_prefill(tmp_path):
    analysis = analysed(tmp_path / "sglang.jsonl", epd_pd())
    requests = analysis.assembly.requests
    assert list(requests["request_id"]) == [RID]  # one request, named by its rid
    assert analysis.summary.quality["no_window"] == 0
    got, ttft = parts_ms(analysis)
    assert got == EXPECTED
    assert sum(got.values()) == ttft == 450


def test_the_join_follows_the_request_s_own_id_whatever_it_is(tmp_path):
    # The client's id for the request (the server's response id) sorts before the rid:
    # the transfer's trace takes the id the request goes by, not the rid.
    analysis = analysed(tmp_path / "sglang.jsonl", epd_pd(client_id="0-response"))
    assert list(analysis.assembly.requests["request_id"]) == ["0-response"]
    assert parts_ms(analysis)[0] == EXPECTED


def test_without_a_bootstrap_room_the_transfer_stays_apart(tmp_path):
    analysis = analysed(tmp_path / "sglang.jsonl", epd_pd(room=None))
    assert len(analysis.assembly.requests) == 2
    assert analysis.summary.quality["no_window"] == 1  # the transfer alone has no window
    # only the request's own trace has a window
    assert list(analysis.attribution.requests["trace_id"]) == [format(1, "032x")]
    got, _ = parts_ms(analysis)
    assert got["kv_transfer"] == 60  # [200, 260): the request's own slices


def _table(rows):
    meta = {METADATA_KEY: json.dumps({"source_format": "test"}).encode()}
    return pa.Table.from_pylist(rows, schema=SPAN_SCHEMA).replace_schema_metadata(meta)


def _row(trace, span, name, request_id=None, **attributes):
    return {"trace_id": format(trace, "032x"), "span_id": format(span, "016x"),
            "parent_id": None, "request_id": request_id, "name": name, "stage": "other",
            "start_ns": T0, "end_ns": T0 + 10, "clock": "host:a", "service": "s",
            "attributes": json.dumps(attributes)}


def test_join_names_both_sides_when_neither_has_an_id():
    mapping = StageMapping((Rule("kv_transfer", "xfer", join="room"),))
    rows = [_row(1, 1, "req", room=7), _row(2, 2, "xfer", room=7),
            _row(3, 3, "xfer", room=8),  # no partner: stays without an id
            _row(4, 4, "req", room=9, request_id="r-9"), _row(5, 5, "xfer", room=9)]
    out = mapping.apply(_table(rows))
    assert out.column("request_id").to_pylist() == ["room=7", "room=7", None, "r-9", "r-9"]


def test_a_rule_s_request_id_attribute_comes_before_gen_ai_request_id():
    rows = [_row(1, 1, "prefill Req 1a2b3c4d", rid=RID, **{"gen_ai.request.id": "g-1"}),
            _row(2, 2, "llm_request", **{"gen_ai.request.id": "g-2"})]
    for row in rows:
        row["service"] = "sglang"
    out = default_mapping().apply(_table(rows))
    assert out.column("request_id").to_pylist() == [RID, "g-2"]
