"""Files in schema version 2 (ids as bytes): what every writer writes where the ids are
W3C hex, read back as they were written (ids as text unless a reader asks for them as
bytes), side by side with version-1 files, which are read forever; ``ttft import``
migrates one, and ``ttft analyze`` answers alike for both."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from test_store import rows
from typer.testing import CliRunner

from ttft.collectors import TraceWriter, read_spans, write_trace
from ttft.collectors._spans import to_span_table
from ttft.collectors.synthetic import generate
from ttft.reports.cli import app
from ttft.tracer.schema import METADATA_KEY, SPAN_SCHEMA, SPAN_SCHEMA_V2
from ttft.tracer.span_ids import is_v2, to_v1


def _rows(table: pa.Table) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in table.to_pylist())


def _file_is_v2(path) -> bool:
    return is_v2(pq.read_schema(path))


def _odd(start: int, stop: int) -> list[dict]:
    """Rows whose trace ids are not W3C ids: only version 1 holds them."""
    return [{**r, "trace_id": f"t{i}"} for i, r in enumerate(rows(start, stop), start)]


def test_w3c_ids_are_written_as_bytes_and_read_back_as_text(tmp_path):
    path = write_trace(tmp_path / "t.parquet", to_span_table(rows(0, 9)))
    assert _file_is_v2(path)
    assert pq.read_schema(path).remove_metadata() == SPAN_SCHEMA_V2
    table = read_spans(path)
    assert table.schema.remove_metadata() == SPAN_SCHEMA
    assert sorted(table.to_pylist(), key=lambda r: r["start_ns"]) == rows(0, 9)
    native = read_spans(path, native=True)
    assert native.schema.remove_metadata() == SPAN_SCHEMA_V2
    assert to_v1(native).equals(table)


def test_other_ids_are_written_as_text_in_version_1(tmp_path):
    path = write_trace(tmp_path / "t.parquet", to_span_table(_odd(0, 5)))
    assert not _file_is_v2(path)
    assert read_spans(path, native=True).column("trace_id").to_pylist() == [
        f"t{i}" for i in range(5)]


def test_a_directory_of_both_versions_reads_as_version_1(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    write_trace(runs / "a.parquet", to_span_table(rows(0, 4)))
    write_trace(runs / "b.parquet", to_span_table(_odd(4, 7)))
    assert _file_is_v2(runs / "a.parquet") and not _file_is_v2(runs / "b.parquet")
    for native in (False, True):
        table = read_spans(runs, native=native)
        assert not is_v2(table.schema)
        assert [r["trace_id"] for r in table.to_pylist()] == [
            f"{i:032x}" for i in range(4)] + [f"t{i}" for i in range(4, 7)]


def test_a_directory_of_version_2_runs_reads_as_version_2(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    write_trace(runs / "a.parquet", to_span_table(rows(0, 4)))
    write_trace(runs / "b.parquet", SPAN_SCHEMA.empty_table())
    write_trace(runs / "c.parquet", to_span_table(rows(4, 6)))
    assert is_v2(read_spans(runs, native=True).schema)
    assert read_spans(runs).to_pylist() == rows(0, 6)


def test_a_writer_merges_parts_as_bytes_unless_one_part_holds_other_ids(tmp_path):
    plain = tmp_path / "plain.parquet"
    with TraceWriter(plain, flush_spans=3, flush_interval_s=None) as writer:
        writer.append(rows(0, 10))
    assert _file_is_v2(plain)
    assert read_spans(plain).to_pylist() == rows(0, 10)
    mixed = tmp_path / "mixed.parquet"
    with TraceWriter(mixed, flush_spans=3, flush_interval_s=None) as writer:
        writer.append(rows(0, 6))
        writer.append(_odd(6, 9))
    assert not _file_is_v2(mixed)
    assert sorted(read_spans(mixed).to_pylist(), key=lambda r: r["start_ns"]) == \
        rows(0, 6) + _odd(6, 9)


def test_ttft_import_migrates_a_version_1_file_and_analyze_answers_alike(tmp_path):
    old = tmp_path / "old.parquet"
    table = generate(150, seed=5).table
    pq.write_table(table.replace_schema_metadata(
        {METADATA_KEY: json.dumps({"schema_version": 1}).encode()}), old)
    assert not _file_is_v2(old)
    new = tmp_path / "new.parquet"
    runner = CliRunner()
    done = runner.invoke(app, ["import", str(old), "-o", str(new)])
    assert done.exit_code == 0, done.output
    assert _file_is_v2(new)
    assert _rows(read_spans(new)) == _rows(read_spans(old))  # rows may be grouped anew
    answers = []
    for path in (old, new):
        out = json.loads(runner.invoke(app, ["analyze", str(path), "--json"]).stdout)
        answers.append({k: v for k, v in out.items() if k not in ("trace", "schema_version")})
    assert answers[0] == answers[1] and answers[0]["requests"] == 150


def test_a_dataset_is_written_as_bytes_and_read_as_text_unless_asked(tmp_path):
    from ttft.collectors import TraceLocation, read_partition

    table = generate(40, seed=2).table
    source = write_trace(tmp_path / "t.parquet", table)
    dataset = tmp_path / "ds"
    done = CliRunner().invoke(app, ["partition", str(source), "-o", str(dataset),
                                    "--partitions", "2"])
    assert done.exit_code == 0, done.output
    assert all(_file_is_v2(f) for f in dataset.glob("part=*/*.parquet"))
    text, own = read_partition(dataset, 1)
    raw, own_raw = read_partition(dataset, 1, native=True)
    assert not is_v2(text.schema) and is_v2(raw.schema) and own == own_raw
    assert to_v1(raw).equals(text)
    assert _rows(read_spans(dataset)) == _rows(table)
    held = TraceLocation(str(source), table=read_spans(source, native=True))
    assert not is_v2(held.read().schema) and is_v2(held.read(native=True).schema)
