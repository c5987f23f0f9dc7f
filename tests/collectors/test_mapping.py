"""Stage mappings: rules as data, and vLLM, SGLang and TGI traces in their documented shapes
(collectors/importers/mappings.toml names the sources) with known attribution."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.collectors import synthetic
from ttft.collectors.importers.mapping import (
    Rule,
    StageMapping,
    default_mapping,
    load_mapping,
)
from ttft.tracer.schema import METADATA_KEY, SPAN_SCHEMA, stage_of

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
TGI = "text-generation-inference.router"


def row(trace, span, name, start_ms, end_ms=None, *, parent=None, stage=None, service="svc",
        clock="host:test", request_id=None, t0=T0, **attributes):
    """One span-table row; times in ms after ``t0``; the stage an importer would set."""
    end_ms = start_ms if end_ms is None else end_ms
    if stage is None:
        stage = stage_of(name)
        stage = "event" if stage == "other" and start_ms == end_ms else stage
    return {
        "trace_id": format(trace, "032x"),
        "span_id": None if span is None else format(span, "016x"),
        "parent_id": None if parent is None else format(parent, "016x"),
        "request_id": request_id,
        "name": name,
        "stage": stage,
        "start_ns": t0 + round(start_ms * MS),
        "end_ns": t0 + round(end_ms * MS),
        "clock": clock,
        "service": service,
        "attributes": json.dumps(attributes),
    }


def table(rows):
    meta = {METADATA_KEY: json.dumps({"source_format": "test"}).encode()}
    return pa.Table.from_pylist(rows, schema=SPAN_SCHEMA).replace_schema_metadata(meta)


def stages(t):
    return [(r["name"], r["stage"]) for r in t.to_pylist()]


def parts(t, boundary=None):
    """Per request (in request order): the nonzero attributed stages in ms, and TTFT."""
    result = attribute(assemble(t), boundary)
    out = []
    for i in range(len(result.requests)):
        got = {k: v / MS for k, v in result.attributed.iloc[i].items() if v}
        out.append((got, result.requests["ttft_ns"].iloc[i] / MS))
    return result, out


# --- rules on hand-built tables ---------------------------------------------------------


def test_rules_map_other_rows_by_name_glob_service_and_attribute():
    mapping = StageMapping((
        Rule("queue", "waiting"),
        Rule("prefill", "fwd_*", service="eng*"),
        Rule("server", "root", attribute="kind"),
        Rule("schedule", "sched", attribute="phase=admit"),
        Rule("tokenize", "tok", attribute="n=3"),
    ))
    rows = [
        row(1, 1, "waiting", 0, 5),
        row(1, 2, "fwd_a", 5, 9, service="engine"),
        row(1, 3, "fwd_b", 5, 9, service="router"),  # service glob does not match
        row(1, 4, "root", 0, 10, kind="SERVER"),
        row(1, 5, "root", 0, 10),  # attribute absent
        row(1, 6, "sched", 0, 1, phase="admit"),
        row(1, 7, "sched", 0, 1, phase="resume"),
        row(1, 8, "tok", 0, 1, n=3),  # numbers compare as their JSON text
    ]
    out = mapping.apply(table(rows))
    assert stages(out) == [
        ("waiting", "queue"), ("fwd_a", "prefill"), ("fwd_b", "other"), ("root", "server"),
        ("root", "other"), ("sched", "schedule"), ("sched", "other"), ("tok", "tokenize"),
    ]
    assert out.schema == table(rows).schema  # schema and metadata kept


def test_set_stages_stay_and_first_matching_rule_wins():
    mapping = StageMapping((
        Rule("queue", "a*"),
        Rule("prefill", "a1"),
        Rule("queue", "tokenize"),  # no replace: a canonical name keeps its stage
        Rule("queue", "x"),
    ))
    rows = [
        row(1, 1, "a1", 0, 1),
        row(1, 2, "tokenize", 0, 1),
        row(1, 3, "x", 0, 1, stage="sample"),  # explicit ttft.stage
        row(1, 4, "x", 3),  # a point event: only "event" rules touch it
    ]
    assert stages(mapping.apply(table(rows))) == [
        ("a1", "queue"), ("tokenize", "tokenize"), ("x", "sample"), ("x", "event"),
    ]


def test_replace_touches_only_stages_taken_from_the_name():
    mapping = StageMapping((Rule("other", "schedule", replace=True),
                            Rule("event", "tick", replace=True)))
    rows = [
        row(1, 1, "schedule", 0, 9),  # stage from its name: a false friend
        row(1, 2, "schedule", 0, 9, stage="queue"),  # explicit ttft.stage: kept
        row(1, 3, "tick", 4, stage="tokenize"),  # explicit stage, stage != name: kept
        row(1, 4, "tick", 5, 6),  # an interval never becomes an event
        row(1, 5, "tick", 7),
    ]
    assert stages(mapping.apply(table(rows))) == [
        ("schedule", "other"), ("schedule", "queue"), ("tick", "tokenize"), ("tick", "other"),
        ("tick", "event"),
    ]


def test_first_takes_the_earliest_row_of_each_trace_and_later_rules_see_the_rest():
    mapping = StageMapping((Rule("prefill", "it", first=True), Rule("step", "it")))
    rows = [row(1, 1, "it", 20, 30), row(1, 2, "it", 10, 20), row(2, 3, "it", 50, 60)]
    assert [r["stage"] for r in mapping.apply(table(rows)).to_pylist()] == [
        "step", "prefill", "prefill"]


def test_first_end_derives_one_event_per_trace():
    mapping = StageMapping((Rule("prefill", "pf", derive="first_end:first_sampled"),))
    rows = [row(1, 1, "pf", 10, 30, request_id="r1"), row(1, 2, "pf", 40, 50),
            row(2, 3, "pf", 5, 8, service="other-svc", clock="host:b")]
    out = mapping.apply(table(rows)).to_pylist()[3:]
    assert [(r["trace_id"][-1], r["name"], r["stage"], r["start_ns"] - T0, r["end_ns"] - T0,
             r["parent_id"], r["request_id"], r["service"], r["clock"]) for r in out] == [
        ("1", "first_sampled", "event", 30 * MS, 30 * MS, format(1, "016x"), "r1", "svc",
         "host:test"),
        ("2", "first_sampled", "event", 8 * MS, 8 * MS, format(3, "016x"), None, "other-svc",
         "host:b"),
    ]


def test_apply_is_a_no_op_on_a_ttft_native_table():
    native = synthetic.generate(50).table
    assert default_mapping().apply(native) is native
    assert StageMapping().apply(native) is native


def _chunked(t, cuts):
    """``t`` in chunks at ``cuts``, each chunk's ``stage`` and ``service`` a dictionary of its
    own (in its own order, a value repeated, a value no row uses), as files read in
    batches give."""
    pieces = []
    for lo, hi in zip([0, *cuts], [*cuts, t.num_rows], strict=True):
        part = t.slice(lo, hi - lo)
        for name in ("stage", "service"):
            values = part.column(name).cast(pa.string()).to_pylist()
            vocab = ["unused", *sorted(set(values), reverse=hi % 2 == 0)]
            vocab.insert(1, vocab[-1])  # the same value twice in one dictionary
            codes = pa.array([len(vocab) - 1 - vocab[::-1].index(v) for v in values], pa.int32())
            column = pa.DictionaryArray.from_arrays(codes, pa.array(vocab, pa.string()))
            part = part.set_column(part.schema.get_field_index(name), part.schema.field(name),
                                   column)
        pieces.append(part)
    return pa.concat_tables(pieces)


def test_rules_see_each_row_s_value_whatever_its_chunk_s_dictionary():
    mapping = StageMapping((Rule("queue", "waiting"), Rule("prefill", "fwd", service="eng")))
    rows = [row(1, 1, "waiting", 0, 5, service="eng"), row(1, 2, "fwd", 5, 9, service="eng"),
            row(2, 3, "fwd", 0, 4, service="router"), row(2, 4, "waiting", 4, 6),
            row(3, 5, "fwd", 1, 2, service="eng"), row(3, 6, "done", 2, 2)]
    expected = stages(mapping.apply(table(rows)))
    assert expected == [("waiting", "queue"), ("fwd", "prefill"), ("fwd", "other"),
                        ("waiting", "queue"), ("fwd", "prefill"), ("done", "event")]
    for cuts in ([2], [1, 4], [3, 5]):
        assert stages(mapping.apply(_chunked(table(rows), cuts))) == expected


def test_a_request_id_attribute_in_any_chunk_fills_its_row():
    rows = [row(1, 1, "waiting", 0, 5), row(2, 2, "waiting", 0, 5),
            row(3, 3, "waiting", 0, 5, **{"gen_ai.request.id": "r-3"})]
    for cuts in ([1], [2], [1, 2]):
        out = default_mapping().apply(_chunked(table(rows), cuts))
        assert out.column("request_id").to_pylist() == [None, None, "r-3"]
    assert default_mapping().apply(table(rows[:2])).column("request_id").to_pylist() == [
        None, None]


def test_default_table_names_its_sources():
    rules = default_mapping().rules
    assert {r.source for r in rules} == {"vllm", "sglang", "tgi", "llm-d", "trtllm"}
    assert rules[0] == Rule("server", "llm_request", source="vllm", derive="vllm_latency")


# --- TOML -------------------------------------------------------------------------------


def test_user_rules_win_over_the_defaults(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[[rule]]\nstage = "queue"\nname = "prefill_waiting"\n'
                    '[[rule]]\nstage = "sample"\nname = "prefill_forward"\n')
    mapping = load_mapping(path)
    assert mapping.rules[0] == Rule("queue", "prefill_waiting", source="user")
    assert mapping.rules[2:] == default_mapping().rules
    rows = [row(1, 1, "prefill_forward", 0, 5, service="sglang")]
    out = mapping.apply(table(rows)).to_pylist()
    assert [r["stage"] for r in out] == ["sample"]  # and no derived event: default lost


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[rule]]\nstage = "queue"\nname = "a"\n[[rule]]\nstage = "decode"\nname = "b"\n',
         "rule 2: field 'stage': unknown stage 'decode'"),
        ('[[rule]]\nstage = "queue"\n', "rule 1: field 'name': missing"),
        ('[[rule]]\nstage = "queue"\nname = 3\n', "rule 1: field 'name': expected str, got int"),
        ('[[rule]]\nstage = "queue"\nname = "a"\nfirst = "yes"\n',
         "rule 1: field 'first': expected bool, got str"),
        ('[[rule]]\nstage = "queue"\nname = "a"\nservise = "x"\n',
         "rule 1: unknown field(s) servise"),
        ('[[rule]]\nstage = "queue"\nname = "a"\nderive = "first_end:"\n',
         "rule 1: field 'derive': unknown derivation"),
        ('[[rule]]\nstage = "unattributed"\nname = "a"\n', "rule 1: field 'stage'"),
        ('rule = 1\n', "'rule' must be an array of tables"),
        ('[rules]\n', "unknown top-level key(s) rules"),
        ('[[rule]\nstage = \n', "not TOML"),
    ],
)
def test_bad_mapping_files_name_the_file_rule_and_field(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        StageMapping.from_toml(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_a_missing_mapping_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read the mapping file"):
        load_mapping(tmp_path / "nope.toml")


# --- vLLM -------------------------------------------------------------------------------


def vllm_span(trace, t0, request_id, **latency_s):
    """vLLM's one span per finished request (OutputProcessor.do_tracing): start = arrival,
    end = finish, attributes in seconds; default OpenTelemetry service name."""
    attrs = {
        "gen_ai.response.model": "meta-llama/Llama-3.1-8B-Instruct",
        "gen_ai.request.id": request_id,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.max_tokens": 256,
        "gen_ai.request.n": 1,
        "gen_ai.usage.prompt_tokens": 512,
        "gen_ai.usage.completion_tokens": 128,
        "gen_ai.latency.e2e": 2.4,
        "gen_ai.latency.time_in_model_decode": 2.1,
        "gen_ai.latency.time_in_model_inference": 2.145,
        **{f"gen_ai.latency.{k}": v for k, v in latency_s.items()},
    }
    return row(trace, trace, "llm_request", 0, 2400, t0=t0, service="unknown_service",
               clock="host:gpu-node", **attrs)


VLLM_TIMES = {"time_in_queue": 0.120, "time_in_model_prefill": 0.045,
              "time_to_first_token": 0.180}


def test_vllm_latencies_become_intervals_with_the_rest_unattributed():
    t = table([vllm_span(1, T0, "cmpl-a", **VLLM_TIMES),
               vllm_span(2, T0 + 987_654_321, "cmpl-b", **VLLM_TIMES)])
    mapped = default_mapping().apply(t)
    result, got = parts(mapped)
    assert result.boundary == "engine"  # no first_byte: the server window does not exist
    assert got == [({"queue": 120, "prefill": 45, "unattributed": 15}, 180)] * 2
    assert result.requests["request_id"].tolist() == ["cmpl-a", "cmpl-b"]
    att = result.attributed.iloc[0]
    assert (att["queue"], att["prefill"], att["unattributed"]) == (
        120_000_000, 45_000_000, 15_000_000)
    assert default_mapping().apply(t).equals(mapped)  # derived span ids are deterministic


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        # V0: no prefill duration; the queue is placed, the rest is unattributed
        ({"time_in_queue": 0.120, "time_to_first_token": 0.180},
         [({"queue": 120, "unattributed": 60}, 180)]),
        ({"time_in_queue": "0.12", "time_in_model_prefill": 0.045,
          "time_to_first_token": 0.180}, []),  # no queue: no window start
        ({"time_in_queue": 0.120, "time_in_model_prefill": -0.01,
          "time_to_first_token": 0.180}, [({"queue": 120, "unattributed": 60}, 180)]),
        ({"time_in_queue": 0.120, "time_in_model_prefill": float("nan"),
          "time_to_first_token": True}, []),  # no first_sampled: no window end
        ({"time_in_queue": 0.120, "time_in_model_prefill": 1e300,
          "time_to_first_token": 0.180}, [({"queue": 120, "unattributed": 60}, 180)]),
        ({}, []),
    ],
)
def test_vllm_missing_or_bad_durations_place_nothing(times, expected):
    span = vllm_span(1, T0, "cmpl-a", **times)
    result, got = parts(default_mapping().apply(table([span])), "engine")
    assert got == expected
    assert result.quality.counts["no_window"] == 1 - len(expected)


def test_vllm_attributes_that_are_not_an_object_never_crash():
    span = vllm_span(1, T0, "cmpl-a", **VLLM_TIMES)
    for attrs in ("[1, 2]", "not json", None):
        span["attributes"] = attrs
        out = default_mapping().apply(table([span]))
        assert out.num_rows == 1 and out.column("stage").to_pylist() == ["server"]


# --- SGLang -----------------------------------------------------------------------------


def sglang_request(trace, rid, chunks):
    """One request as SGLang's request tracing nests it (service "sglang"): the root
    "{role} Req {rid[:8]}" (role "" when not disaggregated), a thread span per process and
    the RequestStage slices under them; prefill_forward [150, end of the last chunk)."""
    s = dict(service="sglang", clock="host:sgl-node")
    tok, sch = 10 * trace + 1, 10 * trace + 2
    prefill_end = chunks[-1][1]
    rows = [
        row(trace, 100 * trace, f" Req {rid[:8]}", 0, 900, rid=rid, module="sglang::request",
            **s),
        row(trace, tok, "Tokenizer (host:0c1d2e3f | pid:101)", 0, 60, parent=100 * trace,
            host_id="0c1d2e3f", pid=101, thread_label="Tokenizer", **s),
        row(trace, tok * 100 + 1, "tokenize", 0, 40, parent=tok, **s),
        row(trace, tok * 100 + 2, "dispatch", 45, 60, parent=tok, **s),
        row(trace, sch, "Scheduler [TP 0] (host:0c1d2e3f | pid:202)", 62, 900,
            parent=100 * trace, tp_rank=0, thread_label="Scheduler", **s),
        row(trace, sch * 100 + 1, "request_process", 62, 70, parent=sch, **s),
        row(trace, sch * 100 + 2, "prefill_waiting", 70, 150, parent=sch, **s),
        # trace_event("schedule", ...) on the waiting slice, as an importer may name it
        row(trace, sch * 100 + 3, "schedule", 149, parent=sch * 100 + 2, bid="9f3c",
            batch_size=2, **s),
        row(trace, sch * 100 + 4, "prefill_forward", 150, prefill_end, parent=sch, **s),
        row(trace, sch * 100 + 5, "decode_forward", prefill_end, 900, parent=sch, **s),
        row(trace, sch * 100 + 6, "decode_loop", prefill_end, prefill_end + 20,
            parent=sch * 100 + 5, decode_ct=0, **s),
    ]
    if len(chunks) > 1:
        rows += [row(trace, sch * 100 + 10 + i, "chunked_prefill", a, b, parent=sch * 100 + 4,
                     **s) for i, (a, b) in enumerate(chunks)]
    return rows


def test_sglang_slices_give_the_engine_boundary():
    t = table(sglang_request(1, "1a2b3c4d5e6f", [(150, 220), (220, 300)])
              + sglang_request(2, "9f8e7d6c5b4a", [(150, 260)]))
    mapped = default_mapping().apply(t)
    by_name = dict(stages(mapped))
    assert by_name[" Req 1a2b3c4d"] == "server" and by_name["schedule"] == "event"
    result, got = parts(mapped)
    assert result.boundary == "engine"  # no first-token event of SGLang's own: derived
    common = {"tokenize": 40, "other": 20, "unattributed": 2, "schedule": 8, "queue": 80}
    assert got == [({**common, "prefill.chunk": 150}, 300), ({**common, "prefill": 110}, 260)]


# --- TGI --------------------------------------------------------------------------------


def tgi_request(trace):
    """TGI's router spans for one /generate_stream request (service TGI), and the engine
    trace of the batch that prefilled it (trace + 1)."""
    s = dict(service=TGI, clock="host:tgi-node")
    return [
        row(trace, 2, "POST /generate_stream", 10, 590, parent=1, **s),
        row(trace, 3, "generate_stream", 11, 590, parent=2, total_time="579ms", **s),
        row(trace, 4, "generate_stream", 12, 590, parent=3, **s),
        row(trace, 5, "validate", 13, 31, parent=4, **s),
        row(trace, 6, "validate_input", 14, 30, parent=5, **s),
        row(trace, 7, "tokenize", 15, 29, parent=6, **s),
        row(trace, 8, "schedule", 32, 590, parent=4, **s),
        row(trace, 9, "append", 32, 33, parent=8, **s),
        row(trace, 10, "queued", 33, 100, parent=8, **s),
        row(trace, 11, "infer", 100, 240, parent=8, **s),
        row(trace, 12, "infer", 240, 260, parent=8, **s),
        row(trace, 13, "infer", 260, 280, parent=8, **s),
        row(trace + 1, 20, "batch", 100, 238, batch_size=1, **s),
        row(trace + 1, 21, "prefill", 100, 238, parent=20, **s),
        row(trace + 1, 22, "prefill", 101, 237, parent=21, id=0, size=1, **s),
    ]


def test_tgi_spans_through_the_client_boundary():
    client = [
        row(7, 1, "client", 0, 600, clock="client", service="loadgen"),
        row(7, 30, "sent", 0, parent=1, clock="client", service="loadgen"),
        row(7, 31, "first_token", 250, parent=1, clock="client", service="loadgen"),
    ]
    mapped = default_mapping().apply(table(client + tgi_request(7)))
    assert [s for n, s in stages(mapped) if n in ("schedule", "batch", "prefill", "infer")] == [
        "other", "prefill", "other", "other", "step", "forward", "forward"]
    result, got = parts(mapped)
    assert result.boundary == "client" and len(result.requests) == 1  # batch trace: no request
    assert got == [({"network": 10, "server": 4, "tokenize": 18, "other": 11, "queue": 67,
                     "prefill": 140}, 250)]


def test_tgi_alone_has_no_window():
    result, got = parts(default_mapping().apply(table(tgi_request(7))))
    assert result.boundary == "engine" and got == []
    assert result.quality.counts["no_window"] == 1


def test_tgi_engine_boundary_by_the_documented_user_rule(tmp_path):
    path = tmp_path / "tgi.toml"
    path.write_text('[[rule]]\nstage = "prefill"\nname = "infer"\n'
                    'service = "text-generation-inference*"\nfirst = true\n'
                    'derive = "first_end:first_sampled"\n')
    result, got = parts(load_mapping(path).apply(table(tgi_request(7))))
    # validate [13, 31) starts the window; the first infer's end [240] closes it
    assert result.boundary == "engine"
    assert got == [({"tokenize": 18, "unattributed": 1, "other": 1, "queue": 67,
                     "prefill": 140}, 227)]
