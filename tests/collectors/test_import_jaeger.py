"""Jaeger JSON importer: the UI/API shapes, references, tag types, logs, ids, clocks; and a
request-shaped trace attributed end to end."""

import json

import pytest

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.collectors import TraceFileError, event_span_id, guess_format, read_spans
from ttft.collectors.importers import IMPORTERS
from ttft.tracer.schema import STAGE_NAMES

T0_US = 1_700_000_000_000_000
T0_NS = T0_US * 1000
TRACE_1 = "0af7651916cd43dd8448eb211c80319c"
TRACE_2_SHORT = "463ac35c9f6413ad"
TRACE_2 = "0000000000000000463ac35c9f6413ad"
A, B, C = "b7ad6b7169203331", "00f067aa0ba902b7", "1111111111111111"
D, E = "2222222222222222", "3333333333333333"


def tag(key, kind, value):
    return {"key": key, "type": kind, "value": value}


def ref(kind, trace_id, span_id):
    return {"refType": kind, "traceID": trace_id, "spanID": span_id}


def span(trace_id, span_id, name, process, start_us, duration_us, **extra):
    return {"traceID": trace_id, "spanID": span_id, "operationName": name,
            "references": [], "startTime": start_us, "duration": duration_us, "tags": [],
            "logs": [], "processID": process, "warnings": None, **extra}


TRACE_ONE = {
    "traceID": TRACE_1,
    "spans": [
        span(TRACE_1, A, "http.request", "p1", T0_US, 1000, flags=1,
             warnings=["clock skew adjustment disabled"],
             tags=[tag("http.method", "string", "POST"), tag("cached", "bool", True),
                   tag("retried", "bool", "false"), tag("tokens", "int64", 42),
                   tag("big", "int64", "9007199254740993"), tag("ratio", "float64", 0.25),
                   tag("blob", "binary", "AQID")],
             logs=[{"timestamp": T0_US + 100,
                    "fields": [tag("event", "string", "retry"), tag("attempt", "int64", 2)]},
                   {"timestamp": T0_US + 200, "fields": [tag("message", "string", "slow")]}]),
        span(TRACE_1, B, "db.query", "p2", T0_US + 100, 300,
             references=[ref("CHILD_OF", TRACE_1, A)]),
        span(TRACE_1, C, "enqueue", "p2", T0_US + 500, 50,
             references=[ref("FOLLOWS_FROM", TRACE_1, B)],
             tags=[tag("ttft.clock", "string", "host:override"),
                   tag("request_id", "string", "req-7")]),
    ],
    "processes": {
        "p1": {"serviceName": "api", "tags": [tag("hostname", "string", "node-a"),
                                              tag("ip", "string", "10.0.0.1")]},
        "p2": {"serviceName": "worker", "tags": [tag("ip", "string", "10.0.0.2")]},
    },
    "warnings": None,
}
TRACE_TWO = {
    "traceID": TRACE_2_SHORT,
    "spans": [
        span(TRACE_2_SHORT, D, "prefill", "p1", T0_US + 2000, 400,
             logs=[{"timestamp": T0_US + 2400,
                    "fields": [tag("event", "string", "first_sampled"),
                               tag("token_id", "int64", 7)]}]),
        span(TRACE_2_SHORT, E, "wait", "p1", T0_US + 1900, 100,
             references=[ref("CHILD_OF", TRACE_2_SHORT, D)],
             tags=[tag("ttft.stage", "string", "queue")]),
    ],
    "processes": {"p1": {"serviceName": "solo"}},
    "warnings": None,
}


def event_id(span_id: str, index: int) -> str:
    return event_span_id(span_id, index)  # the one rule every producer of rows follows


def rows(table):
    out = table.to_pylist()
    for row in out:
        row["attributes"] = json.loads(row["attributes"])
    return out


def write(tmp_path, document, name="trace.json"):
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def row(trace_id, span_id, parent_id, name, stage, start_ns, end_ns, clock, service,
        attributes, request_id=None):
    return {"trace_id": trace_id, "span_id": span_id, "parent_id": parent_id,
            "request_id": request_id, "name": name, "stage": stage, "start_ns": start_ns,
            "end_ns": end_ns, "clock": clock, "service": service, "attributes": attributes}


EXPECTED = [
    row(TRACE_1, A, None, "http.request", "other", T0_NS, T0_NS + 1_000_000, "host:node-a",
        "api", {"http.method": "POST", "cached": True, "retried": False, "tokens": 42,
                "big": 9007199254740993, "ratio": 0.25, "blob": "AQID", "jaeger.flags": 1,
                "jaeger.warnings": ["clock skew adjustment disabled"],
                "logs": [{"timestamp_ns": T0_NS + 200_000, "fields": {"message": "slow"}}]}),
    row(TRACE_1, event_id(A, 0), A, "retry", "event", T0_NS + 100_000, T0_NS + 100_000,
        "host:node-a", "api", {"attempt": 2}),
    row(TRACE_1, B, A, "db.query", "other", T0_NS + 100_000, T0_NS + 400_000,
        "host:10.0.0.2", "worker", {}),
    row(TRACE_1, C, None, "enqueue", "other", T0_NS + 500_000, T0_NS + 550_000,
        "host:override", "worker",
        {"links": [{"trace_id": TRACE_1, "span_id": B,
                    "attributes": {"opentracing.ref_type": "follows_from"}}]},
        request_id="req-7"),
    row(TRACE_2, D, None, "prefill", "prefill", T0_NS + 2_000_000, T0_NS + 2_400_000,
        "host:solo", "solo", {}),
    row(TRACE_2, event_id(D, 0), D, "first_sampled", "event", T0_NS + 2_400_000,
        T0_NS + 2_400_000, "host:solo", "solo", {"token_id": 7}),
    row(TRACE_2, E, D, "wait", "queue", T0_NS + 1_900_000, T0_NS + 2_000_000, "host:solo",
        "solo", {}),
]


def test_ui_download_reads_to_exact_rows(tmp_path):
    path = write(tmp_path, {"data": [TRACE_ONE, TRACE_TWO]})

    table = IMPORTERS["jaeger"].read(path)

    assert rows(table) == EXPECTED
    meta = json.loads(table.schema.metadata[b"ttft"])
    assert (meta["source_format"], meta["source"]) == ("jaeger", str(path))


def test_api_response_single_trace_and_list_shapes_read_the_same(tmp_path):
    shapes = {
        "api": {"data": [TRACE_ONE, TRACE_TWO], "total": 0, "limit": 0, "offset": 0,
                "errors": None},
        "list": [TRACE_ONE, TRACE_TWO],
    }
    for name, document in shapes.items():
        assert rows(IMPORTERS["jaeger"].read(write(tmp_path, document, f"{name}.json"))) == (
            EXPECTED
        ), name
    single = IMPORTERS["jaeger"].read(write(tmp_path, TRACE_TWO, "single.json"))
    assert rows(single) == EXPECTED[4:]


# A request seen by the server: µs offsets from REQ_US.
REQ_US = T0_US + 10_000
REQ_TRACE = "5b8efff798038103d269b633813fc60c"
REQUEST = {
    "traceID": REQ_TRACE,
    "spans": [
        span(REQ_TRACE, "a000000000000001", "server", "p1", REQ_US, 1000),
        *(
            span(REQ_TRACE, f"a00000000000000{i}", name, "p1", REQ_US + start, end - start,
                 references=[ref("CHILD_OF", REQ_TRACE, "a000000000000001")])
            for i, (name, start, end) in enumerate(
                [("tokenize", 10, 60), ("queue", 50, 200), ("prefill", 200, 700),
                 ("sample", 700, 750)], start=2)
        ),
        span(REQ_TRACE, "a000000000000006", "stream", "p1", REQ_US + 750, 50,
             references=[ref("CHILD_OF", REQ_TRACE, "a000000000000001")],
             logs=[{"timestamp": REQ_US + 800,
                    "fields": [tag("event", "string", "first_byte")]}]),
    ],
    "processes": {"p1": {"serviceName": "engine", "tags": [tag("hostname", "string", "srv")]}},
}


def test_request_trace_attributes_by_stage(tmp_path):
    path = write(tmp_path, {"data": [REQUEST], "total": 0, "limit": 0, "offset": 0,
                            "errors": None})

    result = attribute(assemble(read_spans(path)), "server")

    # Window [0, 800) µs; tokenize (priority 9) wins its overlap with queue (50-60).
    expected = dict.fromkeys(STAGE_NAMES, 0) | {
        "server": 10_000, "tokenize": 50_000, "queue": 140_000, "prefill": 500_000,
        "sample": 50_000, "stream": 50_000,
    }
    assert result.requests["ttft_ns"].tolist() == [800_000]
    assert result.attributed.iloc[0].to_dict() == expected


def test_guess_format_tells_jaeger_from_chrome(tmp_path):
    jaeger = write(tmp_path, {"data": [TRACE_ONE]}, "jaeger.json")
    chrome = write(tmp_path, {"traceEvents": [{"ph": "X", "name": "x", "pid": 1, "tid": 1,
                                               "ts": 0, "dur": 1}]}, "chrome.json")

    assert guess_format(jaeger) == "jaeger"
    assert guess_format(chrome) == "chrome"
    assert IMPORTERS["jaeger"].guess_can_open(chrome) is False
    assert IMPORTERS["chrome"].guess_can_open(jaeger) is False
    assert IMPORTERS["jaeger"].guess_can_open(tmp_path) is False


def test_an_answer_that_matched_nothing_is_an_empty_jaeger_trace(tmp_path):
    """``/api/traces`` with no match: nothing in it says ``traceID``, yet it is Jaeger's."""
    empty = tmp_path / "empty.json"
    empty.write_text('{"data": [], "total": 0, "limit": 0, "offset": 0, "errors": null}')
    assert guess_format(empty) == "jaeger"
    assert read_spans(empty).num_rows == 0
    for i, text in enumerate(('{"data": []}', '{"data": [], "errors": []}',  # no total
                              '{"data": [], "total": 0, "traceEvents": []}')):  # not its key
        other = tmp_path / f"other{i}.json"
        other.write_text(text)
        assert IMPORTERS["jaeger"].guess_can_open(other) is False, text


def test_an_answer_with_errors_says_them(tmp_path):
    """An answer that failed is not an empty trace; one that found some traces keeps them
    and says what it could not find in the metadata."""
    failed = tmp_path / "failed.json"
    failed.write_text('{"data": null, "total": 0, "limit": 0, "offset": 0, '
                      '"errors": [{"code": 500, "msg": "storage unavailable"}]}')
    assert guess_format(failed) == "jaeger"
    with pytest.raises(TraceFileError, match="answered with errors.*code 500: storage unavail"):
        read_spans(failed)
    many = tmp_path / "many.json"  # longer than the 4 KiB a guess reads
    many.write_text(json.dumps({"data": None, "total": 0, "limit": 0, "offset": 0, "errors": [
        {"code": 404, "msg": "trace not found", "traceID": f"{i:032x}"} for i in range(60)]}))
    assert guess_format(many) == "jaeger"
    with pytest.raises(TraceFileError, match=r"not found \(trace 0{32}\).*and 55 more"):
        read_spans(many)
    partial = write(tmp_path, {"data": [TRACE_ONE], "total": 1, "limit": 0, "offset": 0,
                               "errors": [{"code": 404, "msg": "trace not found"}]})
    table = IMPORTERS["jaeger"].read(partial)
    assert table.num_rows > 0
    meta = json.loads(table.schema.metadata[b"ttft"])
    assert meta["query_errors"] == ["code 404: trace not found"]


def test_truncated_file_names_the_file(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(json.dumps({"data": [TRACE_ONE]})[:300])

    assert guess_format(path) == "jaeger"
    with pytest.raises(TraceFileError) as info:
        read_spans(path)
    assert info.value.path == str(path)
    assert str(info.value).startswith(f"{path}: not valid JSON")


def test_bad_tag_names_the_element(tmp_path):
    bad = {**TRACE_TWO, "spans": [{**TRACE_TWO["spans"][0],
                                    "tags": [tag("n", "int64", "many")]}]}
    path = write(tmp_path, {"data": [bad]})

    with pytest.raises(TraceFileError) as info:
        IMPORTERS["jaeger"].read(path)
    assert str(info.value) == (
        f"{path}: data[0].spans[0].tags[0].value: 'many' is not a valid int64 value"
    )


def test_missing_process_names_the_span(tmp_path):
    bad = {**TRACE_TWO, "processes": {}}
    path = write(tmp_path, bad)

    with pytest.raises(TraceFileError) as info:
        IMPORTERS["jaeger"].read(path)
    assert str(info.value) == f"{path}: trace.spans[0].processID: no process 'p1' in 'processes'"
