"""Interval rules: the time between two timestamped events of one span becomes a stage
(collectors/importers/mapping.py), tested on hand-built tables and, end to end through the
OTLP importer and the one analysis, on vLLM's request journey events, a shape proposed
upstream and not merged (vllm-project/vllm#33136; mappings.toml names the sources)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from _otlp_json import T0, Span, analysed, parts_ms, write
from typer.testing import CliRunner

from ttft.analysis.part import reattributed
from ttft.analysis.pipeline import analyze
from ttft.collectors import read_spans, synthetic
from ttft.collectors.importers import _mapping_apply, _mapping_events
from ttft.collectors.importers.mapping import Rule, StageMapping, default_mapping
from ttft.reports.cli import app
from ttft.tracer.schema import METADATA_KEY, SPAN_SCHEMA, stage_of

MS = 1_000_000


def row(span, name, start_ms, end_ms=None, *, parent=None, trace=1, service="engine",
        **attributes):
    """A row as an importer leaves it: a span's stage from its name (``other`` when not a
    stage), an event (a point row, ``parent`` the span that carried it) ``event``."""
    end_ms = start_ms if end_ms is None else end_ms
    stage = stage_of(name)
    if stage == "other" and start_ms == end_ms:
        stage = "event"
    return {"trace_id": format(trace, "032x"), "span_id": format(span, "016x"),
            "parent_id": None if parent is None else format(parent, "016x"),
            "request_id": None, "name": name, "stage": stage,
            "start_ns": T0 + start_ms * MS, "end_ns": T0 + end_ms * MS,
            "clock": "host:a", "service": service, "attributes": json.dumps(attributes)}


def table(rows):
    meta = {METADATA_KEY: json.dumps({"source_format": "test"}).encode()}
    return pa.Table.from_pylist(rows, schema=SPAN_SCHEMA).replace_schema_metadata(meta)


def intervals(mapping, rows):
    """The rows the mapping added: ``(name, stage, start ms, end ms, parent span)``."""
    out = mapping.apply(table(rows)).to_pylist()[len(rows):]
    return [(r["name"], r["stage"], (r["start_ns"] - T0) / MS, (r["end_ns"] - T0) / MS,
             int(r["parent_id"], 16)) for r in out]


# --- the rule on hand-built tables ------------------------------------------------------


def test_each_start_runs_to_the_first_end_no_earlier_start_took():
    rule = Rule("preempted", "core", from_event="P", to_event="S")
    rows = [row(1, "core", 0, 100),
            row(2, "S", 5, parent=1),  # before any P: ends nothing
            row(3, "P", 10, parent=1), row(4, "P", 12, parent=1),  # two open starts
            row(5, "S", 30, parent=1),  # ends the first
            row(6, "S", 40, parent=1),  # ends the second
            row(7, "P", 70, parent=1)]  # no end left: places nothing
    assert intervals(StageMapping((rule,)), rows) == [
        ("P..S", "preempted", 10, 30, 1), ("P..S", "preempted", 12, 40, 1)]


def test_without_one_event_the_span_s_start_or_end_stands_in():
    mapping = StageMapping((Rule("route", "gw", to_event="picked"),
                            Rule("stream", "gw", from_event="sent")))
    rows = [row(1, "gw", 0, 50), row(2, "picked", 7, parent=1), row(3, "picked", 9, parent=1),
            row(4, "sent", 40, parent=1)]
    assert intervals(mapping, rows) == [("start..picked", "route", 0, 7, 1),
                                        ("sent..end", "stream", 40, 50, 1)]


def test_only_events_of_a_span_the_rule_matches_count():
    rule = Rule("queue", "core", service="eng*", attribute="role=decode",
                from_event="Q", to_event="S")
    rows = [row(1, "core", 0, 100, role="decode"), row(2, "Q", 10, parent=1),
            row(3, "S", 20, parent=1),
            row(4, "core", 0, 100, trace=2, role="prefill"),  # attribute differs
            row(5, "Q", 10, parent=4, trace=2), row(6, "S", 30, parent=4, trace=2),
            row(7, "core", 0, 100, trace=3, service="router"),  # service differs
            row(8, "Q", 10, parent=7, trace=3), row(9, "S", 40, parent=7, trace=3),
            row(10, "other", 0, 100, trace=4),  # name differs
            row(11, "Q", 10, parent=10, trace=4), row(12, "S", 50, parent=10, trace=4),
            # the same span id in another trace is another span: its events are its own
            row(1, "core", 0, 100, trace=5, role="decode"), row(13, "Q", 60, parent=1, trace=5),
            row(14, "S", 70, parent=1, trace=5)]
    got = StageMapping((rule,)).apply(table(rows)).to_pylist()[len(rows):]
    assert [(r["trace_id"][-1], (r["start_ns"] - T0) / MS, (r["end_ns"] - T0) / MS)
            for r in got] == [("1", 10, 20), ("5", 60, 70)]
    assert len({r["span_id"] for r in got}) == 2


def test_intervals_map_no_row_and_every_one_applies():
    mapping = StageMapping((Rule("queue", "*", from_event="Q", to_event="S"),
                            Rule("prefill", "*", from_event="S", to_event="F"),
                            Rule("schedule", "core")))  # still maps the span itself
    rows = [row(1, "core", 0, 100), row(2, "Q", 10, parent=1), row(3, "S", 20, parent=1),
            row(4, "F", 60, parent=1)]
    out = mapping.apply(table(rows)).to_pylist()
    assert [r["stage"] for r in out] == [
        "schedule", "event", "event", "event", "queue", "prefill"]
    # derived: children of the span, its trace, clock, service; ids hashed, so stable
    assert {(r["parent_id"], r["clock"], r["service"]) for r in out[4:]} == {
        (format(1, "016x"), "host:a", "engine")}
    assert mapping.apply(table(rows)).equals(mapping.apply(table(rows)))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"from_event": "a", "to_event": "a"}, "field 'to_event': must differ"),
        ({"from_event": "a", "stage": "event"}, "field 'stage': an interval rule"),
        ({"from_event": "a", "derive": "vllm_latency"}, "field 'derive': not allowed"),
        ({"to_event": "a", "first": True}, "field 'first': not allowed"),
        ({"to_event": "a", "join": "k"}, "field 'join': not allowed"),
        ({"from_event": ""}, "field 'from_event': must not be empty"),
        ({"from_event": 3}, "field 'from_event': expected str, got int"),
    ],
)
def test_bad_interval_rules_name_the_field(tmp_path, fields, message):
    body = {"stage": "queue", "name": "x", **fields}
    path = tmp_path / "bad.toml"
    path.write_text("[[rule]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in body.items()))
    with pytest.raises(ValueError, match=message):
        StageMapping.from_toml(path)


def test_a_table_without_the_event_names_gets_no_per_row_work(monkeypatch):
    native = synthetic.generate(200).table

    def boom(*args, **kwargs):
        raise AssertionError("per-row work on a table no rule fits")

    monkeypatch.setattr(_mapping_apply.Apply, "attributes", boom)
    monkeypatch.setattr(_mapping_apply, "add_intervals", boom)
    monkeypatch.setattr(_mapping_events, "add_intervals", boom)
    assert default_mapping().apply(native) is native
    only_intervals = StageMapping((Rule("queue", "*", from_event="Q", to_event="S"),))
    assert only_intervals.apply(native) is native
    # a name the table has is not enough: both events must be among its names
    half = StageMapping((Rule("queue", "*", from_event="queue", to_event="nope"),))
    assert half.apply(native) is native


# --- vLLM's proposed journey events, end to end -----------------------------------------


def journey(trace, *, preempted):
    """One request as the proposed journey tracing exports it: the API span ``llm_request``
    (input processing between ARRIVED and HANDOFF_TO_CORE) and its child, the core span
    ``llm_core`` with the scheduler's events; optionally preempted before its first token
    and SCHEDULED again (RESUME)."""
    base = 1000 * (trace - 1)
    core = [("journey.QUEUED", base + 15, {"phase": "WAITING"}),
            ("journey.SCHEDULED", base + 60, {"schedule.kind": "FIRST"})]
    if preempted:
        core += [("journey.PREEMPTED", base + 100, {"num_preemptions": 1}),
                 ("journey.SCHEDULED", base + 180, {"schedule.kind": "RESUME"})]
    core += [("journey.FIRST_TOKEN", base + 280), ("journey.FINISHED", base + 305)]
    first_token = base + 300
    return [
        Span(10 * trace + 1, "client", base, base + 320, trace=trace, service="loadgen",
             attributes={"ttft.clock": "client", "outcome": "ok"},
             events=[("first_token", first_token)]),
        Span(10 * trace + 2, "llm_request", base + 5, base + 310, parent=10 * trace + 1,
             trace=trace, service="vllm", attributes={"gen_ai.request.id": f"cmpl-{trace}"},
             events=[("api.ARRIVED", base + 5), ("api.HANDOFF_TO_CORE", base + 12),
                     ("api.FIRST_RESPONSE_FROM_CORE", base + 292),
                     ("api.DEPARTED", base + 310)]),
        Span(10 * trace + 3, "llm_core", base + 15, base + 305, parent=10 * trace + 2,
             trace=trace, service="vllm", events=core),
    ]


def test_journey_events_give_queue_prefill_preempted_and_the_first_token(tmp_path):
    spans = journey(1, preempted=True) + journey(2, preempted=False)
    analysis = analysed(tmp_path / "journey.jsonl", spans)
    assert analysis.attribution.boundary == "client"
    # Client window [0, 300): network until the server span, tokenize (ARRIVED ->
    # HANDOFF_TO_CORE), the server span alone until QUEUED, queue until SCHEDULED, prefill
    # until FIRST_TOKEN less the preemption (PREEMPTED -> the RESUME SCHEDULED), then the
    # core span (`other`) carries the first token to the client's window end.
    preempted, ttft = parts_ms(analysis, 0)
    assert preempted == {"network": 5, "tokenize": 7, "server": 3, "queue": 45,
                         "prefill": 140, "preempted": 80, "other": 20}
    assert sum(preempted.values()) == ttft == 300
    plain, ttft = parts_ms(analysis, 1)
    assert plain == {"network": 5, "tokenize": 7, "server": 3, "queue": 45, "prefill": 220,
                     "other": 20}
    assert sum(plain.values()) == ttft == 300
    # The engine boundary: ARRIVED (the first tokenize) to FIRST_TOKEN (first_sampled);
    # the hand-off to the engine core (HANDOFF_TO_CORE -> QUEUED) is no stage's.
    engine = reattributed(analysis, "engine")
    got, ttft = parts_ms(engine, 0)
    assert got == {"tokenize": 7, "unattributed": 3, "queue": 45, "prefill": 140,
                   "preempted": 80}
    assert sum(got.values()) == ttft == 275
    assert list(engine.assembly.requests["request_id"]) == ["cmpl-1", "cmpl-2"]


def test_ttft_analyze_json_reads_the_journey_file(tmp_path):
    path = write(tmp_path / "journey.jsonl", journey(1, preempted=True))
    result = CliRunner().invoke(app, ["analyze", str(path), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["boundary"] == "client" and summary["requests_ok"] == 1
    means = {stage: row["mean"] for stage, row in summary["stages"].items() if row["mean"]}
    assert means == {"network": 5.0, "tokenize": 7.0, "server": 3.0, "queue": 45.0,
                     "prefill": 140.0, "preempted": 80.0, "other": 20.0}
    assert sum(means.values()) == summary["ttft_ms"]["mean"] == 300.0
    assert summary["quality"]["no_window"] == 0


def test_a_mapped_table_read_again_keeps_its_derived_rows_once(tmp_path):
    # `ttft import` writes the mapped table; reading that file maps it again
    mapped = read_spans(write(tmp_path / "journey.jsonl", journey(1, preempted=True)))
    assert default_mapping().apply(mapped) is mapped
    out = tmp_path / "journey.parquet"
    result = CliRunner().invoke(app, ["import", str(tmp_path / "journey.jsonl"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    again = analyze(read_spans(out))
    assert again.summary.quality["duplicate_span_id"] == 0
    assert parts_ms(again)[0]["preempted"] == 80
