"""The Perfetto export: event-format validity, tracks, lanes, flows, the ``export`` command."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from _build import event, row, table, tid
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ttft.collectors import write_trace
from ttft.collectors.synthetic import generate
from ttft.reports.cli import app
from ttft.reports.perfetto import perfetto_events, request_traces, validate_events
from ttft.tracer.schema import BOUNDARY_EVENTS

runner = CliRunner()
ENGINE = ("step", "forward", "gpu")


@pytest.fixture(scope="module")
def synth() -> pa.Table:
    return generate(50, seed=7).table


@pytest.fixture(scope="module")
def events(synth) -> list[dict]:
    return perfetto_events(synth)


def spans_of(t: pa.Table) -> list[dict]:
    return t.to_pylist()


def names_of(events: list[dict], kind: str, arg: str = "name") -> dict[int, str]:
    return {e["pid"]: e["args"][arg] for e in events if e["ph"] == "M" and e["name"] == kind}


def test_synthetic_export_is_valid(events):
    assert validate_events(events) == []
    json.loads(json.dumps(events, allow_nan=False))
    phases = [e["ph"] for e in events]
    assert set(phases[: phases.count("M")]) == {"M"}
    timed = [e["ts"] for e in events if e["ph"] != "M"]
    assert timed == sorted(timed) and timed[0] == 0.0


def test_every_non_root_request_span_is_one_async_slice(synth, events):
    rows = spans_of(synth)
    expected = Counter(
        (r["trace_id"], r["name"], r["span_id"])
        for r in rows
        if r["stage"] not in ("event", "client", "server", *ENGINE)
    )
    began = Counter(
        (e["args"]["trace_id"], e["name"], e["args"]["span_id"]) for e in events if e["ph"] == "b"
    )
    assert began == expected
    assert sum(e["ph"] == "e" for e in events) == sum(expected.values())


def test_every_point_event_is_an_async_instant(synth, events):
    rows = spans_of(synth)
    expected = Counter((r["trace_id"], r["name"]) for r in rows if r["stage"] == "event")
    got = Counter((e["args"]["trace_id"], e["name"]) for e in events if e["ph"] == "n")
    assert got == expected
    for trace in {r["trace_id"] for r in rows if r["stage"] == "client"}:
        assert {name for t, name in got if t == trace} >= set(BOUNDARY_EVENTS)


def test_one_named_process_per_service_and_clock(events):
    assert sorted(names_of(events, "process_name").values()) == [
        "engine · host:synth",
        "gpu:0",
        "loadgen · client",
    ]
    order = names_of(events, "process_sort_index", "sort_index")
    client = next(p for p, n in names_of(events, "process_name").items() if n.endswith("client"))
    assert order[client] == 0


def test_gpu_spans_are_complete_events_on_the_device_thread(synth, events):
    # The synthetic cohorts run concurrently, so their GPU spans overlap: the later of two
    # overlapping ones goes to an overflow thread.
    pids = {n: p for p, n in names_of(events, "process_name").items()}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    gpu = [e for e in events if e.get("cat") == "gpu"]
    assert len(gpu) == sum(r["stage"] == "gpu" for r in spans_of(synth))
    assert {(e["ph"], e["pid"]) for e in gpu} == {("X", pids["gpu:0"])}
    assert threads[(pids["gpu:0"], 0)] == "device 0"
    assert {threads[(e["pid"], e["tid"])].split(" (")[0] for e in gpu} == {"device 0"}
    assert sum(e["tid"] == 0 for e in gpu) > len(gpu) / 2
    steps = [e for e in events if e.get("cat") in ("step", "forward")]
    assert {(e["ph"], e["pid"]) for e in steps} == {("X", pids["engine · host:synth"])}
    assert {threads[(e["pid"], e["tid"])].split(" (")[0] for e in steps} == {"engine steps"}


def test_timestamps_are_microseconds_from_the_first_span(synth, events):
    rows = spans_of(synth)
    t0 = min(r["start_ns"] for r in rows)
    server = min((r for r in rows if r["stage"] == "server"), key=lambda r: r["start_ns"])
    (x,) = [e for e in events if e["ph"] == "X" and e["args"]["span_id"] == server["span_id"]]
    assert x["dur"] == round((server["end_ns"] - server["start_ns"]) / 1000, 3)
    assert x["ts"] == round((server["start_ns"] - t0) / 1000, 3)


def test_one_flow_per_request_from_client_to_server_thread(synth, events):
    roots = {
        (e["args"]["trace_id"], e["name"]): e
        for e in events
        if e["ph"] == "X" and e["name"] in ("client", "server")
    }
    flows = [e for e in events if e["ph"] in "sf"]
    assert Counter(e["ph"] for e in flows) == {"s": 50, "f": 50}
    by_id = {(e["ph"], e["id"]): e for e in flows}
    for trace in request_traces(synth, None):
        client, server = roots[(trace, "client")], roots[(trace, "server")]
        flow_id = next(i for (ph, i), e in by_id.items() if ph == "f" and e["ts"] == server["ts"])
        start, end = by_id[("s", flow_id)], by_id[("f", flow_id)]
        assert (start["pid"], start["tid"]) == (client["pid"], client["tid"])
        assert (end["pid"], end["tid"], end["bp"]) == (server["pid"], server["tid"], "e")
        assert client["ts"] <= start["ts"] < client["ts"] + client["dur"]


def test_requests_limits_the_export(synth):
    events = perfetto_events(synth, requests=10)
    assert validate_events(events) == []
    chosen = request_traces(synth, 10)
    assert len(chosen) == 10
    assert {e["args"]["trace_id"] for e in events if e["ph"] in "bnX" and e["cat"] in (
        "request", "client", "server")} == set(chosen)  # fmt: skip
    assert sum(e["ph"] == "s" for e in events) == 10
    requests = {r["trace_id"] for r in spans_of(synth) if r["stage"] == "client"}
    starts = {
        t: min(r["start_ns"] for r in spans_of(synth) if r["trace_id"] == t) for t in requests
    }
    assert sorted(chosen, key=starts.get) == chosen
    assert max(starts[t] for t in chosen) <= min(v for t, v in starts.items() if t not in chosen)


def lanes_by_name(events: list[dict]) -> dict[str, str]:
    return {e["name"]: e["id2"]["local"].rsplit(".", 1)[1] for e in events if e["ph"] == "b"}


def test_overlapping_spans_of_a_request_take_separate_lanes():
    rows = [
        row(1, 1, "client", 0, 1000, clock="client", service="loadgen"),
        row(1, 2, "server", 100, 900, parent=1),
        row(1, 3, "queue", 200, 500, parent=2),
        row(1, 4, "prefill", 300, 700, parent=2),  # overlaps queue, not nested
        row(1, 5, "prefill.chunk", 300, 400, parent=4),  # nested in both
        row(1, 6, "sample", 700, 800, parent=2),
        event(1, 7, "first_token", 950, parent=1, clock="client", service="loadgen"),
    ]
    events = perfetto_events(table(rows))
    assert validate_events(events) == []
    assert lanes_by_name(events) == {
        "queue": "0",
        "prefill": "1",
        "prefill.chunk": "0",
        "sample": "0",
    }
    server_pid = next(e["pid"] for e in events if e["ph"] == "X" and e["name"] == "server")
    assert {e["pid"] for e in events if e["ph"] == "b"} == {server_pid}


def test_misnested_gpu_and_step_spans_move_to_an_overflow_thread():
    rows = [
        row(1, 1, "server", 0, 1000),
        row(9, 2, "step", 100, 400),
        row(9, 3, "forward", 150, 450, parent=2),  # outlasts its step
        row(9, 4, "gpu", 160, 500, parent=3, clock="gpu:1"),
        row(9, 5, "gpu", 450, 600, parent=3, clock="gpu:1"),  # overlaps the previous one
    ]
    events = perfetto_events(table(rows))
    assert validate_events(events) == []
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    placed = {(e["name"], e["ts"]): threads[(e["pid"], e["tid"])] for e in events if e["ph"] == "X"}
    assert placed == {
        ("server", 0.0): "request 00000001",
        ("step", 0.1): "engine steps",
        ("forward", 0.15): "engine steps (overflow 1)",
        ("gpu", 0.16): "device 1",
        ("gpu", 0.45): "device 1 (overflow 1)",
    }


def test_engine_spans_outside_the_selected_requests_are_left_out():
    rows = [
        row(1, 1, "server", 1000, 2000),
        row(9, 2, "step", 0, 999),
        row(9, 3, "step", 1500, 2500),
        row(2, 4, "server", 5000, 6000),
        row(9, 5, "step", 5000, 5100),
    ]
    events = perfetto_events(table(rows), requests=1)
    assert [(e["name"], e["ts"]) for e in events if e["ph"] == "X"] == [
        ("server", 0.0),
        ("step", 0.5),
    ]


def test_no_requests_gives_no_events():
    assert perfetto_events(table([row(9, 1, "step", 0, 10)])) == []
    assert perfetto_events(table([])) == []


def test_bad_attributes_never_make_invalid_json():
    rows = [row(1, 1, "server", 0, 10), row(1, 2, "queue", 1, 5, parent=1)]
    rows[1]["attributes"] = '{"x": NaN, "y": 1e999}'
    events = perfetto_events(table(rows))
    assert validate_events(events) == []
    (queue,) = [e for e in events if e["ph"] == "b"]
    assert queue["args"]["attributes"] == {"raw": '{"x": NaN, "y": 1e999}'}


NAMES = [
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}},
]


def async_event(ph: str, ts: float, name: str = "a", local: str = "r.0") -> dict:
    return {"ph": ph, "ts": ts, "name": name, "cat": "request", "pid": 1, "tid": 1,
            "id2": {"local": local}}  # fmt: skip


def x(ts: float, dur: float, name: str = "x") -> dict:
    return {"ph": "X", "ts": ts, "dur": dur, "name": name, "pid": 1, "tid": 1}


def flow(ph: str, ts: float) -> dict:
    out = {"ph": ph, "ts": ts, "name": "f", "cat": "flow", "id": 1, "pid": 1, "tid": 1}
    return {**out, "bp": "e"} if ph == "f" else out


def test_a_good_hand_made_list_validates():
    events = [*NAMES, x(0, 10), x(2, 3), async_event("b", 1), async_event("n", 2),
              async_event("e", 4), flow("s", 1), flow("f", 6)]  # fmt: skip
    assert validate_events(events) == []


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ([async_event("b", 1)], "never ends"),
        ([async_event("e", 1)], "without a matching 'b'"),
        ([async_event("b", 1, "a"), async_event("e", 2, "z")], "closes 'b'"),
        ([x(0, 10), x(5, 10)], "partially overlaps"),
        ([x(0, 10), flow("s", 1)], "0 'f'"),
        ([x(0, 10), flow("s", 1), flow("f", 20)], "outside every X slice"),
        ([{**x(0, 1), "pid": 2}], "pid 2 has no process_name"),
        ([{**x(0, 1), "tid": 7}], "tid 7 has no thread_name"),
        ([{"ph": "X", "pid": 1, "tid": 1, "name": "x", "ts": 0}], "missing dur"),
        ([x(float("nan"), 1)], "not a finite number"),
        ([x(0, -1)], "negative dur"),
        ([{**async_event("b", 1), "id2": {}}], "no id or id2"),
        ([{"ph": "i", "ts": 1, "name": "i", "pid": 1, "s": "q"}], "scope 'q'"),
        ([{**flow("f", 1), "bp": "x"}, x(0, 10), flow("s", 1)], "without bp 'e'"),
        ([{"ph": "M", "name": "process_labels", "pid": 1, "args": {}}], "bad metadata"),
        ([{"ph": "Q", "pid": 1}], "unknown phase"),
    ],
)
def test_validate_events_catches(bad, says):
    problems = validate_events([*NAMES, *bad])
    assert any(says in p for p in problems), problems


# A few requests of random spans: client and server roots, children anywhere (nested,
# overlapping, outside their root), point events, and engine spans that may misnest.
span_times = st.tuples(st.integers(0, 2_000), st.integers(0, 600))
request_spans = st.fixed_dictionaries(
    {
        "client": st.one_of(st.none(), span_times),
        "server": st.one_of(st.none(), span_times),
        "children": st.lists(
            st.tuples(
                st.sampled_from(["queue", "prefill", "connect", "odd"]), span_times, st.booleans()
            ),
            max_size=8,
        ),  # fmt: skip
        "events": st.lists(st.tuples(st.sampled_from(BOUNDARY_EVENTS), st.integers(0, 2_600))),
    }
)
engine_spans = st.lists(
    st.tuples(st.sampled_from(ENGINE), span_times, st.sampled_from(["gpu:0", "gpu:1"])),
    max_size=10,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(request_spans, min_size=1, max_size=4), engine_spans, st.sampled_from([0, 2]))
def test_random_spans_always_export_valid_events(requests, engine, limit):
    rows, span = [], 0

    def add(trace: int, name: str, times: tuple[int, int], **kw) -> None:
        nonlocal span
        span += 1
        rows.append(row(trace, span, name, times[0], times[0] + times[1], **kw))

    for trace, req in enumerate(requests, start=1):
        if req["client"]:
            add(trace, "client", req["client"], clock="client", service="loadgen")
        if req["server"]:
            add(trace, "server", req["server"])
        for name, times, on_client in req["children"]:
            add(trace, name, times, **({"clock": "client", "service": "loadgen"} if on_client
                                       else {}))  # fmt: skip
        for name, t_ns in req["events"]:
            span += 1
            rows.append(event(trace, span, name, t_ns))
    for name, times, gpu_clock in engine:
        add(99, name, times, **({"clock": gpu_clock} if name == "gpu" else {}))
    t = table(rows)
    events = perfetto_events(t, requests=limit)
    assert validate_events(events) == []
    chosen = set(request_traces(t, limit))
    selected = [r for r in rows if r["trace_id"] in chosen]
    assert sum(e["ph"] == "n" for e in events) == sum(r["stage"] == "event" for r in selected)
    roots = sum(
        any(r["trace_id"] == tid(k) and r["stage"] == stage for r in selected)
        for k in range(1, len(requests) + 1)
        for stage in ("client", "server")
    )
    spans = sum(r["stage"] != "event" and r["stage"] not in ENGINE for r in selected)
    assert sum(e["ph"] == "b" for e in events) == spans - roots


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory, synth) -> Path:
    path = tmp_path_factory.mktemp("export") / "synth.parquet"
    write_trace(path, synth, {"generator": "test"})
    return path


def test_export_command_writes_the_file_and_says_so(trace_file, tmp_path):
    out = tmp_path / "out.json"
    result = runner.invoke(
        app, ["export", str(trace_file), "--perfetto", str(out), "--requests", "10"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["displayTimeUnit"] == "ms"
    events = document["traceEvents"]
    assert validate_events(events) == []
    assert sum(e["ph"] == "s" for e in events) == 10
    assert result.stderr.strip() == (
        f"wrote {out}: 10 requests, {len(events)} events; "
        "open it in https://ui.perfetto.dev or chrome://tracing"
    )


def test_export_command_errors(trace_file, tmp_path):
    missing = tmp_path / "missing.parquet"
    result = runner.invoke(app, ["export", str(missing), "--perfetto", str(tmp_path / "o.json")])
    assert result.exit_code == 2
    assert str(missing) in result.stderr
    result = runner.invoke(app, ["export", str(trace_file)])
    assert result.exit_code == 2
    assert "nothing to export: give --perfetto OUT.json" in result.stderr
    unwritable = tmp_path / "no-such-dir" / "o.json"
    result = runner.invoke(app, ["export", str(trace_file), "--perfetto", str(unwritable)])
    assert result.exit_code == 2
    assert f"{unwritable}: cannot write" in result.stderr


def test_export_command_on_a_trace_without_requests(tmp_path):
    path = tmp_path / "engine.parquet"
    write_trace(path, table([row(9, 1, "step", 0, 10)]), {})
    out = tmp_path / "o.json"
    result = runner.invoke(app, ["export", str(path), "--perfetto", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["traceEvents"] == []
    assert "holds no requests" in result.stderr
    assert "0 requests, 0 events" in result.stderr
