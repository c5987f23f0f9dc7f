"""``ttft export --perfetto`` read back: the chrome importer recognises ttft's own export and
reads the exported spans, so analysing the export gives the source's answer."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ttft.collectors import read_spans, write_trace
from ttft.collectors.synthetic import generate
from ttft.reports.cli import app

runner = CliRunner()
MS = 1_000_000
FIELDS = ("trace_id", "span_id", "parent_id", "request_id", "name", "stage", "start_ns",
          "end_ns", "clock", "service")


def exported(tmp_path: Path, tab: pa.Table, *args: str) -> tuple[Path, Path]:
    source, out = tmp_path / "t.parquet", tmp_path / "t.json"
    write_trace(source, tab)
    result = runner.invoke(app, ["export", str(source), "--perfetto", str(out), *args])
    assert result.exit_code == 0, result.output
    return source, out


def analysed(path: Path, *args: str) -> dict:
    result = runner.invoke(app, ["analyze", str(path), "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def keyed(tab: pa.Table) -> dict[tuple, tuple]:
    rows = tab.select([*FIELDS, "attributes"]).to_pylist()
    return {(r["trace_id"], r["span_id"]): (*(r[f] for f in FIELDS),
                                            json.loads(r["attributes"] or "{}")) for r in rows}


def server_clock_ahead(tab: pa.Table, delta_ns: int) -> pa.Table:
    """Every row not on the client clock reads ``delta_ns`` later (a second host)."""
    moved = pc.not_equal(tab.column("clock"), "client")
    for name in ("start_ns", "end_ns"):
        i, column = tab.schema.get_field_index(name), tab.column(name)
        new = pc.if_else(moved, pc.add(column, delta_ns), column)
        tab = tab.set_column(i, tab.schema.field(name), new)
    return tab


def test_every_exported_span_reads_back_with_its_fields(tmp_path):
    tab = generate(40, seed=5).table
    _, out = exported(tmp_path, tab, "--requests", "0")
    document = json.loads(out.read_text())
    assert document["otherData"]["exporter"] == "ttft"
    back, source = keyed(read_spans(out)), keyed(tab)
    assert len(back) > 0.9 * len(source)
    for key, fields in back.items():
        assert fields == source[key]  # ids, times to the ns, clock, service, attributes
    request_rows = {k for k, v in source.items() if v[5] not in ("step", "forward", "gpu")}
    assert request_rows <= back.keys()  # every request span is in an export of all requests


@pytest.mark.parametrize("boundary", ["client", "server", "engine"])
@pytest.mark.parametrize("policy", ["exclusive", "critical-path"])
def test_analysing_the_export_gives_the_source_answer(tmp_path, boundary, policy):
    tab = server_clock_ahead(generate(120, seed=3).table, 250 * MS)
    source, out = exported(tmp_path, tab, "--requests", "0")
    args = ("--boundary", boundary, "--policy", policy)
    a, b = analysed(source, *args), analysed(out, *args)
    assert a["clocks"][0]["offset_ms"] == -250.0  # the source's server clock is moved
    assert "clocks" not in b  # the export is already on the client clock
    for key in a.keys() - {"trace", "clocks"}:
        assert b[key] == a[key], key
    assert b["requests"] == 120


def test_an_export_of_some_requests_reads_back_as_those(tmp_path):
    _, out = exported(tmp_path, generate(30, seed=2).table, "--requests", "7")
    assert analysed(out)["requests"] == 7


def test_events_without_span_fields_follow_the_generic_rules(tmp_path):
    """An event someone added to an export (no ``trace_id`` in its args) is still read,
    as a chrome event: a trace of its own process."""
    _, out = exported(tmp_path, generate(5, seed=1).table)
    document = json.loads(out.read_text())
    document["traceEvents"].append({"ph": "X", "name": "note", "pid": 999, "tid": 1,
                                    "ts": 0, "dur": 5, "args": {"by": "hand"}})
    out.write_text(json.dumps(document))
    back = read_spans(out)
    note = back.filter(pc.equal(back.column("name"), "note")).to_pylist()
    assert len(note) == 1 and note[0]["service"] == "999"
    assert note[0]["start_ns"] == document["baseTimeNanoseconds"]
    assert analysed(out)["requests"] == 5


def as_recorded(tmp_path: Path, tab: pa.Table) -> Path:
    """``tab`` in a ttft trace file as a collector might have recorded it: rows the writer
    would refuse or rewrite (an end before its start, attributes not strict JSON) kept."""
    path = tmp_path / "t.parquet"
    write_trace(path, generate(1, seed=0).table)  # for the run metadata
    pq.write_table(tab.replace_schema_metadata(pq.read_schema(path).metadata), path)
    return path


def exported_file(path: Path) -> Path:
    out = path.with_suffix(".json")
    result = runner.invoke(app, ["export", str(path), "--perfetto", str(out), "--requests", "0"])
    assert result.exit_code == 0, result.output
    return out


def with_attributes(tab: pa.Table, rows: dict[int, str]) -> pa.Table:
    values = tab.column("attributes").to_pylist()
    for i, text in rows.items():
        values[i] = text
    i = tab.schema.get_field_index("attributes")
    return tab.set_column(i, tab.schema.field("attributes"), pa.array(values, pa.string()))


def test_attributes_that_are_not_strict_json_come_back_as_written(tmp_path):
    """NaN (Python's json.dumps writes it), a trailing comma, a repeated key: the analysis
    reads them, so the export keeps their text: three timeouts stay timeouts (before: the
    export's {"raw": text} made them ok requests)."""
    tab = generate(30, seed=6).table
    stage = tab.column("stage").cast(pa.string()).to_pylist()
    clients = [i for i, s in enumerate(stage) if s == "client"][:3]
    odd = ['{"outcome": "timeout", "error": "read timeout", "x": NaN}',
           '{"outcome": "timeout", "error": "read timeout",}',
           '{"outcome": "ok", "outcome": "timeout", "error": "read timeout"}']
    tab = with_attributes(tab, dict(zip(clients, odd, strict=True)))
    source = as_recorded(tmp_path, tab)
    out = exported_file(source)
    a, b = analysed(source), analysed(out)
    assert a["failures"] == {"timeout": 3}
    for key in a.keys() - {"trace"}:
        assert b[key] == a[key], key


def test_times_come_back_exact_over_a_wide_range(tmp_path):
    """One span stamped near the epoch (an unset start) makes ``ts`` µs floats too coarse
    for ns: the times in the args are exact."""
    tab = generate(20, seed=8).table
    starts = tab.column("start_ns").to_pylist()
    stage = tab.column("stage").cast(pa.string()).to_pylist()
    early = stage.index("tokenize")
    starts[early] = 1_000
    i = tab.schema.get_field_index("start_ns")
    tab = tab.set_column(i, tab.schema.field("start_ns"), pa.array(starts, pa.int64()))
    _, out = exported(tmp_path, tab, "--requests", "0")
    back, source = keyed(read_spans(out)), keyed(tab)
    assert all(fields == source[key] for key, fields in back.items())


def test_a_span_that_ends_before_it_starts_comes_back_as_the_point_drawn(tmp_path):
    tab = generate(12, seed=9).table
    stage = tab.column("stage").cast(pa.string()).to_pylist()
    bad = stage.index("tokenize")
    starts, ends = tab.column("start_ns").to_pylist(), tab.column("end_ns").to_pylist()
    ends[bad] = starts[bad] - 5
    i = tab.schema.get_field_index("end_ns")
    tab = tab.set_column(i, tab.schema.field("end_ns"), pa.array(ends, pa.int64()))
    source = as_recorded(tmp_path, tab)
    assert analysed(source)["quality"]["end_before_start"] == 1
    out = exported_file(source)
    back = read_spans(out)
    row = back.filter(pc.equal(back.column("span_id"), tab.column("span_id")[bad])).to_pylist()
    assert [(r["start_ns"], r["end_ns"]) for r in row] == [(starts[bad], starts[bad])]
