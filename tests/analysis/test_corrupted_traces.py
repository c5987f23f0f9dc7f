"""Randomly corrupted traces: the analyzer never crashes, data quality counts each defect,
and attribution keeps its invariants on whatever is left.

Every example starts from a real-shaped trace (``collectors.synthetic.generate``) and
applies a random mix of corruptions: dropped rows, swapped start/end, duplicated rows and
colliding span ids, a skewed server clock, wrong values (attributes that are not JSON,
negative or huge times, null ids and times, parents that point nowhere or at themselves,
unknown stages, ids of odd length) and, on the file path, truncated or retyped Parquet
files. Expectations are computed from the corrupted rows in plain Python, never by the
analyzer: exact counts where the rule is exact (``missing_field``, ``end_before_start``,
which requests have a window), lower bounds where a defect can cause more of its kind
(``duplicate_span_id``, ``orphan_parent``).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _build import event, row
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.analysis.request_values import request_values
from ttft.analysis.summary import summarize
from ttft.collectors import TraceFileError, read_spans, write_trace
from ttft.collectors.synthetic import generate
from ttft.reports.cli import app
from ttft.tracer.schema import (
    BOUNDARY_EVENTS,
    BOUNDARY_NAMES,
    COLUMNS,
    DERIVED_STAGES,
    EV_FIRST_BYTE,
    EV_FIRST_SAMPLED,
    EV_FIRST_TOKEN,
    METADATA_KEY,
    POLICIES,
    REQUEST_STAGES,
    SPAN_SCHEMA,
    STAGE_NAMES,
)

S = 1_000_000_000
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
SKEWS_NS = (-7 * S, -2 * S, 3 * S, 11 * S)
"""Server clock skews: each larger than any synthetic request, so every request with a
client and a server span contradicts causality at offset 0."""
LIMIT_NS = 1 << 62
"""Times at or beyond ±2^62 ns are unusable (``analysis.clock_offset.TIME_LIMIT_NS``)."""
EXTREME_NS = (0, -1, -(10**18), LIMIT_NS - 1, 1 - LIMIT_NS, LIMIT_NS, -LIMIT_NS, INT64_MIN,
              INT64_MIN + 1, INT64_MAX, INT64_MAX - 1)
BAD_ATTRIBUTES = (
    None,
    "",
    "not json",
    "{",
    "[1, 2]",
    '{"step_id": "3"}',
    '{"step_id": -4}',
    '{"step_id": 99999999999999999999999999}',
    '{"step_id": 1e3, "cached_tokens": -3}',
    '{"cached_tokens": 123456789012345678901234}',
    '{"step_id": ' + "9" * 40,
    "\u00ff\u0000\ufffd",
)
KINDS = (
    "drop",
    "swap",
    "duplicate_rows",
    "duplicate_ids",
    "shared_trace_id",
    "shared_request_id",
    "skew",
    "attributes",
    "extreme_times",
    "null_request_id",
    "dangling_parent",
    "self_parent",
    "null_times",
    "null_trace",
    "null_span_id",
    "unknown_stage",
    "odd_ids",
)
SIZES = [
    pytest.param(100, id="short"),
    pytest.param(1000, id="full", marks=pytest.mark.stress),
]
FILE_SIZES = [
    pytest.param(25, id="short"),
    pytest.param(150, id="full", marks=pytest.mark.stress),
]
runner = CliRunner()


@functools.lru_cache(maxsize=64)
def _base_rows(n: int, seed: int) -> tuple[dict, ...]:
    return tuple(generate(n, seed=seed).table.to_pylist())


_PICK = st.integers(0, 1 << 20)
"""A row index, taken modulo the number of rows when the corruption is applied."""


def _op(kind: str) -> st.SearchStrategy:
    picks = st.lists(_PICK, min_size=1, max_size=12 if kind in ("swap", "attributes") else 4)
    extra = {
        "skew": st.sampled_from(SKEWS_NS),
        "extreme_times": st.lists(
            st.tuples(_PICK, st.sampled_from(("start_ns", "end_ns", "both")),
                      st.sampled_from(EXTREME_NS)), min_size=1, max_size=6),
        "attributes": st.lists(st.tuples(_PICK, st.sampled_from(BAD_ATTRIBUTES)), min_size=1,
                               max_size=12),
        "dangling_parent": st.lists(st.tuples(_PICK, st.integers(0, (1 << 64) - 1)),
                                    min_size=1, max_size=6),
        "null_times": st.lists(st.tuples(_PICK, st.sampled_from(("start_ns", "end_ns"))),
                               min_size=1, max_size=4),
        "unknown_stage": st.lists(
            st.tuples(_PICK, st.sampled_from(("bogus", "", "CLIENT", "prefill "))),
            min_size=1, max_size=4),
        "odd_ids": st.lists(st.tuples(_PICK, st.sampled_from(("a", "0" * 17, "zz-"))),
                            min_size=1, max_size=4),
        "duplicate_ids": st.lists(st.tuples(_PICK, _PICK), min_size=1, max_size=4),
        "shared_trace_id": st.lists(st.tuples(_PICK, _PICK), min_size=1, max_size=4),
        "shared_request_id": st.lists(st.tuples(_PICK, _PICK), min_size=1, max_size=4),
        "drop": st.lists(_PICK, min_size=1, max_size=60),
    }.get(kind, picks)
    return st.tuples(st.just(kind), extra)


corrupted = st.tuples(
    st.integers(5, 30),
    st.integers(0, 15),
    st.lists(st.sampled_from(KINDS), min_size=1, max_size=6, unique=True).flatmap(
        lambda kinds: st.tuples(*[_op(k) for k in sorted(kinds, key=KINDS.index)])
    ),
    st.integers(0, 2**32 - 1),
)
"""A recipe ``(requests, seed, corruptions, shuffle seed)``; `apply` makes the rows."""


def _at(rows: list[dict], pick: int) -> dict:
    return rows[pick % len(rows)]


def _drop(rows: list[dict], picks: list[int], done: dict) -> None:
    gone = {p % len(rows) for p in picks[: max(1, len(rows) // 4)]}
    rows[:] = [r for i, r in enumerate(rows) if i not in gone]


def _skew(rows: list[dict], skew_ns: int, done: dict) -> None:
    done["skew_ns"] = skew_ns
    for r in rows:  # the server's host clock and the gpu clock mapped onto it
        if r["clock"].startswith(("host:", "gpu:")):
            r["start_ns"] += skew_ns
            r["end_ns"] += skew_ns


def _swap(rows: list[dict], picks: list[int], done: dict) -> None:
    for p in set(picks):
        r = _at(rows, p)
        r["start_ns"], r["end_ns"] = r["end_ns"], r["start_ns"]
        done["touched"].add(id(r))


def _extreme_times(rows: list[dict], picks: list[tuple], done: dict) -> None:
    for p, field, value in picks:
        r = _at(rows, p)
        for name in ("start_ns", "end_ns") if field == "both" else (field,):
            r[name] = value
        done["touched"].add(id(r))


def _set(field: str, rows: list[dict], picks: list[tuple], done: dict) -> None:
    """``field`` of each picked row takes the value paired with its pick."""
    for p, value in picks:
        _at(rows, p)[field] = value


def _null(field: str, rows: list[dict], picks: list[int], done: dict) -> None:
    for p in picks:
        _at(rows, p)[field] = None


def _null_times(rows: list[dict], picks: list[tuple], done: dict) -> None:
    for p, field in picks:
        _at(rows, p)[field] = None


def _dangling_parent(rows: list[dict], picks: list[tuple], done: dict) -> None:
    for p, parent in picks:
        _at(rows, p)["parent_id"] = format(parent, "016x")
        done["dangling"].add(id(_at(rows, p)))


def _self_parent(rows: list[dict], picks: list[int], done: dict) -> None:
    for p in picks:
        _at(rows, p)["parent_id"] = _at(rows, p)["span_id"]


def _odd_ids(rows: list[dict], picks: list[tuple], done: dict) -> None:
    # Rename a span to an id that is not 16 characters, its children's parent ids
    # too, so the tree stays whole and only the id form changes.
    for p, new in picks:
        old, trace = _at(rows, p)["span_id"], _at(rows, p)["trace_id"]
        new = f"{new}{p}" if new == "zz-" else new
        for r in rows:
            if old is not None and r["trace_id"] == trace:
                r["span_id"] = new if r["span_id"] == old else r["span_id"]
                r["parent_id"] = new if r["parent_id"] == old else r["parent_id"]


def _duplicate_ids(rows: list[dict], picks: list[tuple], done: dict) -> None:
    for p, q in picks:
        same = [r for r in rows if r["trace_id"] == _at(rows, p)["trace_id"]]
        same[q % len(same)]["span_id"] = _at(rows, p)["span_id"]


def _share(field: str, rows: list[dict], picks: list[tuple], done: dict) -> None:
    # A row moves into another trace, or takes another request's id: requests merge.
    for p, q in picks:
        _at(rows, p)[field] = _at(rows, q)[field]


def _duplicate_rows(rows: list[dict], picks: list[int], done: dict) -> None:
    rows.extend(dict(_at(rows, p)) for p in picks)


CORRUPT: dict[str, Callable[[list[dict], Any, dict], None]] = {
    "drop": _drop,
    "swap": _swap,
    "duplicate_rows": _duplicate_rows,
    "duplicate_ids": _duplicate_ids,
    "shared_trace_id": functools.partial(_share, "trace_id"),
    "shared_request_id": functools.partial(_share, "request_id"),
    "skew": _skew,
    "attributes": functools.partial(_set, "attributes"),
    "extreme_times": _extreme_times,
    "null_request_id": functools.partial(_null, "request_id"),
    "dangling_parent": _dangling_parent,
    "self_parent": _self_parent,
    "null_times": _null_times,
    "null_trace": functools.partial(_null, "trace_id"),
    "null_span_id": functools.partial(_null, "span_id"),
    "unknown_stage": functools.partial(_set, "stage"),
    "odd_ids": _odd_ids,
}
"""Each corruption of `KINDS`: ``(rows, arg, done)`` changes ``rows`` in place and notes in
``done`` what `apply` reports."""


def apply(recipe: tuple) -> tuple[list[dict], dict]:
    """The rows of ``generate(requests, seed)`` after the recipe's corruptions, in the order
    of `KINDS`, and what was done (``skew_ns``; ``touched``/``dangling``: ids of the row
    dicts whose times or parent were changed)."""
    n, seed, ops, shuffle_seed = recipe
    rows = [dict(r) for r in _base_rows(n, seed)]
    done: dict = {"skew_ns": 0, "touched": set(), "dangling": set(),
                  "shuffle_seed": shuffle_seed}
    for kind, arg in ops:
        CORRUPT[kind](rows, arg, done)
    return rows, done


def _table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SPAN_SCHEMA)


def _stage(value: str | None) -> str:
    return value if value in STAGE_NAMES else "other"


def _present(r: dict) -> bool:
    """A row with a trace id and both times, inside the usable range."""
    return r["trace_id"] is not None and all(
        r[name] is not None and -LIMIT_NS < r[name] < LIMIT_NS for name in ("start_ns", "end_ns")
    )


def _valid(r: dict) -> bool:
    return _present(r) and r["end_ns"] >= r["start_ns"]


def _is_span(r: dict) -> bool:
    return _stage(r["stage"]) not in ("event", "step")


def _requests(rows: list[dict]) -> dict[str, list[dict]]:
    """Valid rows of each request (docs/attribution.md, "Requests"): a request trace holds a
    valid request-level span or boundary event; traces with the same request id (a trace's
    smallest, when it has several) are one request, named by its smallest trace id."""
    by_trace: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if _valid(r):
            by_trace[r["trace_id"]].append(r)
    groups: dict[tuple, list[str]] = defaultdict(list)
    for trace, rs in by_trace.items():
        if any(
            _stage(r["stage"]) in REQUEST_STAGES
            or (_stage(r["stage"]) == "event" and r["name"] in BOUNDARY_EVENTS)
            for r in rs
        ):
            rid = min((r["request_id"] for r in rs if r["request_id"] is not None), default=None)
            groups[("trace", trace) if rid is None else ("request", rid)].append(trace)
    return {min(traces): [r for t in traces for r in by_trace[t]] for traces in groups.values()}


def _span_key(r: dict) -> tuple:
    return (r["start_ns"], r["end_ns"], _stage(r["stage"]), r["parent_id"], r["clock"])


def _windows(spans: list[dict], events: list[dict]) -> dict[str, bool]:
    """Which boundaries a request has a window at (docs/design.md, "TTFT windows")."""

    def earliest(stage: str) -> dict | None:
        mine = [r for r in spans if _stage(r["stage"]) == stage]
        return min(mine, key=lambda r: r["start_ns"]) if mine else None

    def first(name: str) -> int | None:
        times = [r["start_ns"] for r in events if r["name"] == name]
        return min(times) if times else None

    def ok(a: int | None, b: int | None) -> bool:
        return a is not None and b is not None and b >= a

    client, server = earliest("client"), earliest("server")
    tokenize, queue, sample = earliest("tokenize"), earliest("queue"), earliest("sample")
    engine_a = (tokenize or queue or {}).get("start_ns")
    engine_b = first(EV_FIRST_SAMPLED)
    if engine_b is None and sample is not None:
        engine_b = sample["end_ns"]
    return {
        "client": client is not None and ok(client["start_ns"], first(EV_FIRST_TOKEN)),
        "server": server is not None and ok(server["start_ns"], first(EV_FIRST_BYTE)),
        "engine": ok(engine_a, engine_b),
    }


def expected(rows: list[dict], done: dict) -> dict:
    """What the analyzer must report, from the corrupted rows alone."""
    missing = sum(not _present(r) for r in rows)
    backwards = sum(_present(r) and r["end_ns"] < r["start_ns"] for r in rows)
    requests = _requests(rows)
    duplicates = orphans = 0
    windows: dict[str, set[str]] = {b: set() for b in BOUNDARY_NAMES}
    unsure: set[str] = set()
    clocked = 0
    for trace, rs in requests.items():
        spans = [r for r in rs if _is_span(r)]
        # Span ids are unique per trace (docs/attribution.md, "The tree").
        ids = Counter((r["trace_id"], r["span_id"]) for r in spans if r["span_id"] is not None)
        duplicates += sum(c - 1 for c in ids.values())
        versions = defaultdict(set)
        for r in spans:
            if r["span_id"] is not None:
                versions[(r["trace_id"], r["span_id"])].add(_span_key(r))
        if any(len(v) > 1 for v in versions.values()):
            unsure.add(trace)  # which copy of a colliding id is kept is the analyzer's rule
        for r in spans:
            if (
                id(r) in done.get("dangling", ())
                and r["span_id"] is not None
                and ids[(r["trace_id"], r["span_id"])] == 1
                and (r["trace_id"], r["parent_id"]) not in ids
            ):
                orphans += 1
        unique = list({(r["trace_id"], r["span_id"], _span_key(r)): r for r in spans}.values())
        events = [r for r in rs if _stage(r["stage"]) == "event"]
        for boundary, has in _windows(unique, events).items():
            if has:
                windows[boundary].add(trace)
        untouched = [r for r in spans if id(r) not in done["touched"]]
        if any(r["stage"] == "client" and r["clock"] == "client" for r in untouched) and any(
            r["stage"] == "server" and r["clock"].startswith("host:") for r in untouched
        ):
            clocked += 1
    return {
        "missing_field": missing,
        "end_before_start": backwards,
        "requests": set(requests),
        "duplicate_span_id": duplicates,
        "orphan_parent": orphans,
        "windows": windows,
        "unsure": unsure,
        "clocked_requests": clocked,
    }


def _by_request(attr) -> dict[tuple, tuple]:
    """Per request (trace id, request id): its ttft and attributed parts."""
    keys = zip(attr.requests["trace_id"], attr.requests["request_id"], strict=True)
    values = zip(attr.requests["ttft_ns"], map(tuple, attr.attributed.to_numpy()), strict=True)
    return dict(zip(keys, values, strict=True))


def check(rows: list[dict], done: dict) -> None:
    table = _table(rows)
    want = expected(rows, done)
    asm = assemble(table)
    counts = asm.quality.counts
    assert counts["missing_field"] == want["missing_field"]
    assert counts["end_before_start"] == want["end_before_start"]
    assert counts["duplicate_span_id"] >= want["duplicate_span_id"]
    assert counts["orphan_parent"] >= want["orphan_parent"]
    assert set(asm.requests["trace_id"]) == want["requests"]
    assert len(asm.requests) == len(want["requests"])

    order = np.random.default_rng(done["shuffle_seed"]).permutation(len(rows))
    shuffled = assemble(table.take(pa.array(order, pa.int64())))
    assert shuffled.quality.counts == counts

    for boundary in BOUNDARY_NAMES:
        for policy in POLICIES:
            attr = attribute(asm, boundary, policy)
            ttft = attr.requests["ttft_ns"].to_numpy()
            parts = attr.attributed.to_numpy()
            assert (ttft >= 0).all()
            assert (parts >= 0).all() and (attr.covered.to_numpy() >= 0).all()
            assert (attr.raw.to_numpy() >= 0).all()
            assert (parts.sum(axis=1) == ttft).all(), "parts must sum exactly to the ttft"
            if policy == "exclusive":  # a part never exceeds its stage's covered time
                own = [i for i, s in enumerate(attr.attributed.columns) if s not in
                       DERIVED_STAGES]
                assert (parts[:, own] <= attr.covered.to_numpy()[:, own]).all()
            got = set(attr.requests["trace_id"])
            assert attr.quality.counts["no_window"] == len(asm.requests) - len(got)
            assert got - want["unsure"] == want["windows"][boundary] - want["unsure"], boundary
            again = attribute(shuffled, boundary, policy)
            assert _by_request(again) == _by_request(attr), (boundary, policy)
        # the last policy's; clocks: the trace's
        summary = summarize(attr, request_values(asm, attr)).to_dict()
        json.dumps(summary)  # what --json prints serializes
        assert summary["requests"] == len(got)
        assert summary["quality"] == attr.quality.counts
        if done["skew_ns"] and want["clocked_requests"]:
            assert "clocks" in summary, "a skewed server clock is reported"
            assert sum(c["violations_before"] for c in summary["clocks"]) >= 1
            for c in summary["clocks"]:
                if c["applied"]:
                    assert abs(c["offset_ms"] * 1e6 + done["skew_ns"]) < S


@pytest.mark.parametrize("examples", SIZES)
def test_corrupted_tables_never_crash_count_defects_and_keep_invariants(examples):
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(corrupted)
    def run(recipe: tuple) -> None:
        check(*apply(recipe))

    run()


def _write(path, rows: list[dict]) -> None:
    write_trace(path, _table([r for r in rows if _valid(r)]), {"workload": {"test": True}})


@st.composite
def truncated(draw) -> tuple[int, int, float]:
    return draw(st.integers(5, 30)), draw(st.integers(0, 15)), draw(st.floats(0, 1,
                                                                            exclude_max=True))


@pytest.mark.parametrize("examples", FILE_SIZES)
def test_truncated_files_raise_trace_file_error_and_analyze_exits_2(examples, tmp_path):
    @settings(max_examples=examples, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(truncated())
    def run(case: tuple[int, int, float]) -> None:
        n, seed, fraction = case
        path = tmp_path / "trace.parquet"
        _write(path, list(_base_rows(n, seed)))
        data = path.read_bytes()
        cut = int(fraction * len(data))
        path.write_bytes(data[:cut])
        with pytest.raises(TraceFileError) as caught:
            read_spans(path)
        assert str(path) in str(caught.value)
        result = runner.invoke(app, ["analyze", str(path)])
        assert result.exit_code == 2, result.output
        assert len(result.stderr.strip().splitlines()) == 1
        assert result.stderr.startswith(f"error: {path}")

    run()


def test_truncated_part_in_a_directory_is_a_clean_error_from_a_fresh_process(tmp_path):
    parts = tmp_path / "run.parquet.parts"
    parts.mkdir()
    rows = list(_base_rows(20, 2))
    half = len(rows) // 2
    _write(parts / "part-000000.parquet", rows[:half])
    _write(parts / "part-000001.parquet", rows[half:])
    broken = parts / "part-000001.parquet"
    broken.write_bytes(broken.read_bytes()[:-37])
    with pytest.raises(TraceFileError, match="part-000001"):
        read_spans(parts)
    done = subprocess.run(
        [sys.executable, "-m", "ttft.reports.cli", "analyze", str(parts)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(broken) in lines[0], lines


RETYPED = {
    "trace_id": (pa.int64(), pa.binary(), pa.float64()),
    "span_id": (pa.int64(), pa.binary()),
    "parent_id": (pa.float64(),),
    "request_id": (pa.int32(),),
    "name": (pa.int64(), pa.list_(pa.string())),
    "stage": (pa.string(), pa.int64()),
    "start_ns": (pa.string(), pa.float64(), pa.int32(), pa.timestamp("ns"), pa.bool_()),
    "end_ns": (pa.string(), pa.float64(), pa.uint64()),
    "clock": (pa.int8(), pa.string()),
    "service": (pa.large_string(), pa.float32()),
    "attributes": (pa.int64(), pa.struct([("k", pa.int64())])),
}


def _retyped_column(table: pa.Table, name: str, to: pa.DataType) -> pa.Array:
    """``table[name]`` as type ``to``: cast where Arrow can, else made-up values of it."""
    column = table.column(name)
    if pa.types.is_dictionary(column.type):
        column = column.cast(pa.string())
    try:
        return column.cast(to, safe=False).combine_chunks()
    except (pa.ArrowException, ValueError, TypeError):
        n = table.num_rows
        if pa.types.is_string(to) or pa.types.is_large_string(to):
            return pa.array([f"x{i}" for i in range(n)], to)
        if pa.types.is_list(to):
            return pa.array([["a", str(i)] for i in range(n)], to)
        if pa.types.is_struct(to):
            return pa.array([{"k": i} for i in range(n)], to)
        return pa.array(np.arange(n) % 7, pa.int64()).cast(to, safe=False)


@pytest.mark.parametrize("examples", FILE_SIZES)
def test_files_with_a_wrongly_typed_column_are_read_or_refused_cleanly(examples, tmp_path):
    """Parquet written by someone else with a column of the wrong type: ``read_spans``
    either casts it to the span schema (then analysis runs and keeps its invariants) or
    raises ``TraceFileError`` naming the file and column; ``ttft analyze`` exits 0 or 2."""
    choices = [(name, to) for name, types in RETYPED.items() for to in types]

    @settings(max_examples=examples, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.sampled_from(choices), st.integers(5, 20), st.integers(0, 15))
    def run(choice: tuple[str, pa.DataType], n: int, seed: int) -> None:
        name, to = choice
        table = _table(list(_base_rows(n, seed)))
        column = _retyped_column(table, name, to)
        index = COLUMNS.index(name)
        table = table.set_column(index, pa.field(name, column.type), column)
        path = tmp_path / "typed.parquet"
        pq.write_table(
            table.replace_schema_metadata({METADATA_KEY: b'{"schema_version": 1}'}), path
        )
        try:
            read = read_spans(path)
        except TraceFileError as exc:
            assert exc.path == str(path) and exc.field == name, exc
            result = runner.invoke(app, ["analyze", str(path)])
            assert result.exit_code == 2, result.output
            assert len(result.stderr.strip().splitlines()) == 1
            return
        assert read.schema.equals(SPAN_SCHEMA, check_metadata=False)
        rows = read.to_pylist()
        check(rows, {"kinds": [], "skew_ns": 0, "touched": {id(r) for r in rows},
                     "shuffle_seed": seed})
        result = runner.invoke(app, ["analyze", str(path), "--json"])
        assert result.exit_code == 0, result.output

    run()



# -- regressions: each bug the random corruptions found, as a plain example ---------------

CLIENT = {"clock": "client", "service": "loadgen"}


def _small(t0: int = 0, scale: int = 1, trace: int = 1, rid: str = "r1") -> list[dict]:
    """One request: a client span around a server span with tokenize, both boundaries."""
    return [
        row(trace, 1, "client", t0, t0 + 100 * scale, **CLIENT),
        row(trace, 2, "server", t0 + 10 * scale, t0 + 95 * scale, parent=1, request_id=rid),
        row(trace, 3, "tokenize", t0 + 12 * scale, t0 + 20 * scale, parent=2),
        row(trace, 4, "sample", t0 + 30 * scale, t0 + 40 * scale, parent=2),
        event(trace, 5, "first_byte", t0 + 80 * scale, parent=2),
        event(trace, 6, "first_token", t0 + 90 * scale, parent=1, **CLIENT),
    ]


def _all_parts(tab: pa.Table) -> dict:
    asm = assemble(tab)
    return {(b, p): _by_request(attribute(asm, b, p)) for b in BOUNDARY_NAMES for p in POLICIES}


def test_times_beyond_the_usable_range_are_dropped_not_wrapped():
    """Found: a client span from -2^63+1 to 2^63-1 made ``b - a`` wrap to a negative TTFT."""
    rows = _small()
    rows[0]["start_ns"], rows[5]["start_ns"] = INT64_MIN + 1, INT64_MAX
    rows[5]["end_ns"] = INT64_MAX
    rows += _small(trace=2, rid="r2")
    rows[6]["start_ns"] = INT64_MIN  # the analyzer's "no time" marker, as data
    asm = assemble(_table(rows))
    assert asm.quality.counts["missing_field"] == 3
    for b in BOUNDARY_NAMES:
        attr = attribute(asm, b)
        assert (attr.attributed.to_numpy().sum(axis=1) == attr.requests["ttft_ns"]).all()
        assert (attr.requests["ttft_ns"] >= 0).all()


def test_windows_longer_than_2_to_the_53_ns_sum_exactly():
    """Found: parts were summed in float64, which is inexact past 2^53 ns (104 days)."""
    rows = _small(t0=-(LIMIT_NS - 1), scale=(1 << 55) + 3)
    asm = assemble(_table(rows))
    for b in BOUNDARY_NAMES:
        for p in POLICIES:
            attr = attribute(asm, b, p)
            assert len(attr.requests) == 1
            total = int(attr.attributed.to_numpy().sum())
            assert total == int(attr.requests["ttft_ns"][0]) > 1 << 53, (b, p)


def test_which_copy_of_a_duplicated_span_id_is_kept_does_not_depend_on_row_order():
    """Found: the first copy in row order was kept, so shuffling changed the parts."""
    rows = _small()
    rows[3]["span_id"] = rows[2]["span_id"]  # sample takes tokenize's id
    forward, backward = _table(rows), _table(rows[::-1])
    assert _all_parts(forward) == _all_parts(backward)
    assert assemble(backward).quality.counts == assemble(forward).quality.counts
    assert assemble(forward).quality.counts["duplicate_span_id"] == 1


def test_a_trace_with_two_request_ids_joins_by_the_smallest_whatever_the_row_order():
    """Found: a trace's first request id in row order joined it, so shuffling regrouped
    requests; a request of two traces is now also named by its smallest trace id."""
    rows = _small(trace=1, rid="r-b") + _small(trace=2, rid="r-a")
    rows[5]["request_id"] = "r-a"  # trace 1's first_token also names trace 2's request
    for ordered in (rows, rows[::-1]):
        asm = assemble(_table(ordered))
        assert asm.requests[["trace_id", "request_id"]].values.tolist() == [
            [format(1, "032x"), "r-a"]
        ]
    assert _all_parts(_table(rows)) == _all_parts(_table(rows[::-1]))


def test_a_huge_skew_is_reported_and_never_moves_times_out_of_int64():
    """Found with extreme times: an estimated offset near 2^63 would wrap moved times."""
    rows = []
    for i in range(12):
        one = _small(t0=LIMIT_NS - 10**12 + i * 1000, trace=i + 1, rid=f"r{i}")
        for r in one:
            if r["clock"] != "client":
                r["start_ns"] -= 2 * LIMIT_NS - 10**13
                r["end_ns"] -= 2 * LIMIT_NS - 10**13
        rows += one
    asm = assemble(_table(rows))
    (pair,) = asm.quality.clocks
    assert pair.requests == 12 and pair.violations_before == 12
    assert not pair.applied  # the remedy would leave int64: reported, not applied
    attr = attribute(asm, "client")
    assert "clocks" in summarize(attr, request_values(asm, attr)).to_dict()
    assert (attr.attributed.to_numpy().sum(axis=1) == attr.requests["ttft_ns"]).all()


FLIP_SIZES = [
    pytest.param(23, id="short"),
    pytest.param(1, id="full", marks=pytest.mark.stress),
]


@pytest.mark.parametrize("stride", FLIP_SIZES)
def test_every_changed_byte_is_read_or_refused_cleanly(stride, tmp_path):
    """Every ``stride``-th byte of a small trace file set to 0xFF in turn: ``read_spans``
    refuses the file with ``TraceFileError`` or returns a table that analysis takes
    without an error."""
    path = tmp_path / "trace.parquet"
    _write(path, list(_base_rows(5, 1)))
    data = path.read_bytes()
    outcomes = Counter()
    for at in range(0, len(data), stride):
        if data[at] == 0xFF:
            continue
        path.write_bytes(data[:at] + b"\xff" + data[at + 1 :])
        try:
            table = read_spans(path)
        except TraceFileError:
            outcomes["refused"] += 1
            continue
        asm = assemble(table)
        for boundary in BOUNDARY_NAMES:
            attr = attribute(asm, boundary)
            assert (attr.attributed.to_numpy().sum(axis=1) == attr.requests["ttft_ns"]).all()
        outcomes["read"] += 1
    assert outcomes["refused"] > 0 and outcomes["read"] > 0, outcomes


def test_two_roots_starting_together_are_chosen_by_value_not_row_order():
    """Found by the full run: a trace's client span given a token event's id (a duplicate
    id) next to four exact copies of the original client span, all starting together.
    The root was the first of them in row order, so a shuffle changed the parts."""
    recipe = (
        5,
        1,
        (("swap", [1]), ("duplicate_rows", [0, 0, 0, 0]), ("duplicate_ids", [(65536, 0)])),
        0,
    )
    check(*apply(recipe))
