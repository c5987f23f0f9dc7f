import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ttft.collectors import TraceFileError, TraceWriter, read_spans, run_metadata
from ttft.collectors._spans import to_span_table
from ttft.collectors.parquet import iter_batches
from ttft.tracer.schema import METADATA_KEY, SCHEMA_VERSION, SPAN_SCHEMA

NEVER = None  # flush_interval_s that disables time-based flushing


def span_row(i: int, **overrides):
    row = {
        "trace_id": f"{i:032x}",
        "span_id": f"{i + 1:016x}",
        "parent_id": None if i % 2 else f"{i:016x}",
        "request_id": f"req-{i}" if i % 3 else None,
        "name": f"span-{i}",
        "stage": ("queue", "prefill", "event")[i % 3],
        "start_ns": 1_700_000_000_000_000_000 + i,
        "end_ns": 1_700_000_000_000_000_000 + 2 * i,
        "clock": "host:a" if i % 2 else "gpu:0",
        "service": "engine",
        "attributes": json.dumps({"i": i}),
    }
    row.update(overrides)
    return row


def rows(start: int, stop: int):
    return [span_row(i) for i in range(start, stop)]


def test_round_trip_keeps_values_types_and_metadata(tmp_path):
    path = tmp_path / "trace.parquet"
    with TraceWriter(path, metadata={"workload": "chat", "seed": 7}) as writer:
        writer.append(rows(0, 6))
        writer.set_metadata(device="H200")

    table = read_spans(path)

    assert table.schema.equals(SPAN_SCHEMA)
    assert table.schema.field("stage").type == pa.dictionary(pa.int32(), pa.string())
    assert table.to_pylist() == rows(0, 6)
    expected_metadata = {
        "workload": "chat",
        "seed": 7,
        "device": "H200",
        "schema_version": SCHEMA_VERSION,
    }
    assert run_metadata(read_spans(path)) == expected_metadata
    assert json.loads(table.schema.metadata[METADATA_KEY]) == expected_metadata
    assert not (tmp_path / "trace.parquet.parts").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.parquet"]


def test_append_casts_tables_and_batches_with_plain_string_columns(tmp_path):
    plain = pa.Table.from_pylist(rows(0, 3))  # stage, clock, service inferred as string
    assert plain.schema.field("stage").type == pa.string()
    int8_dict = pa.RecordBatch.from_pylist(rows(3, 5)).set_column(
        5,
        "stage",
        pa.array(["queue", "prefill"])
        .dictionary_encode()
        .cast(pa.dictionary(pa.int8(), pa.string())),
    )
    path = tmp_path / "trace.parquet"
    with TraceWriter(path, flush_interval_s=NEVER) as writer:
        writer.append(plain)
        writer.append(int8_dict)

    assert read_spans(path).to_pylist() == rows(0, 5)


def test_to_span_table_fills_missing_nullable_columns_with_nulls():
    row = span_row(1)
    for key in ("span_id", "parent_id", "request_id", "attributes"):
        del row[key]

    table = to_span_table([row])

    assert table.schema == SPAN_SCHEMA
    assert table.to_pylist() == [
        {**row, "span_id": None, "parent_id": None, "request_id": None, "attributes": None}
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([span_row(0), {**span_row(1), "dur_ns": 5}], "row 1: unknown field(s) dur_ns"),
        ([span_row(0), span_row(1, name=None)], "row 1, field 'name': null in a required column"),
        (
            [span_row(0), span_row(1, start_ns=10, end_ns=9)],
            "row 1, field 'end_ns': end_ns 9 is before start_ns 10",
        ),
        (
            pa.table({"name": ["x"]}),
            "missing required column(s): trace_id, stage, start_ns, end_ns, clock, service",
        ),
    ],
)
def test_append_rejects_rows_that_do_not_fit_the_schema(tmp_path, data, message):
    with TraceWriter(tmp_path / "t.parquet", flush_interval_s=NEVER) as writer:
        with pytest.raises(ValueError) as excinfo:
            writer.append(data)
    assert str(excinfo.value) == message


def test_many_flushes_write_parts_then_merge_all_rows_in_order(tmp_path):
    path = tmp_path / "trace.parquet"
    parts = tmp_path / "trace.parquet.parts"
    writer = TraceWriter(path, flush_spans=3, flush_interval_s=NEVER)
    for i in range(10):
        writer.append([span_row(i)])

    assert sorted(p.name for p in parts.iterdir()) == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    assert read_spans(parts).to_pylist() == rows(0, 9)
    assert writer.rows_written == 9

    writer.close()
    writer.close()  # idempotent

    assert read_spans(path).to_pylist() == rows(0, 10)
    assert not parts.exists()
    assert pq.ParquetFile(path).metadata.num_rows == 10
    with pytest.raises(ValueError, match="writer is closed"):
        writer.append([span_row(11)])


def test_without_merge_the_directory_of_parts_is_the_trace(tmp_path):
    path = tmp_path / "trace.parquet"
    with TraceWriter(
        path, flush_spans=4, flush_interval_s=NEVER, merge_on_close=False, metadata={"run": 1}
    ) as writer:
        writer.append(rows(0, 10))  # one part of 10: a flush takes the whole buffer
        writer.append(rows(10, 12))

    parts = tmp_path / "trace.parquet.parts"
    assert not path.exists()
    assert sorted(p.name for p in parts.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert read_spans(parts).to_pylist() == rows(0, 12)
    assert read_spans(path).to_pylist() == rows(0, 12)  # falls back to <path>.parts
    assert run_metadata(read_spans(parts)) == {"run": 1, "schema_version": SCHEMA_VERSION}
    assert [b.num_rows for b in iter_batches(parts, batch_rows=7)] == [7, 3, 2]


def test_a_writer_that_never_got_rows_leaves_an_empty_trace(tmp_path):
    path = tmp_path / "trace.parquet"
    TraceWriter(path, metadata={"run": 2}).close()

    assert read_spans(path).num_rows == 0
    assert run_metadata(read_spans(path)) == {"run": 2, "schema_version": SCHEMA_VERSION}


def test_a_killed_writer_leaves_exactly_the_flushed_rows(tmp_path):
    path = tmp_path / "trace.parquet"
    child = textwrap.dedent(
        f"""
        import json, os
        from ttft.collectors import TraceWriter

        def row(i):
            return {{"trace_id": f"{{i:032x}}", "name": f"span-{{i}}", "stage": "queue",
                     "start_ns": i, "end_ns": i + 1, "clock": "client", "service": "load"}}

        writer = TraceWriter({str(path)!r}, metadata={{"run": "crash"}},
                             flush_spans=10**9, flush_interval_s=None)
        writer.append([row(i) for i in range(3)])
        writer.flush()
        writer.append([row(i) for i in range(3, 5)])
        writer.flush()
        writer.append([row(i) for i in range(5, 9)])
        # a crash in the middle of writing the third part
        with open(os.path.join(writer.parts_dir, ".part-00002.parquet.tmp"), "wb") as f:
            f.write(b"PAR1 half a part")
        os._exit(1)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stderr) == (1, "")

    parts = tmp_path / "trace.parquet.parts"
    assert sorted(p.name for p in parts.iterdir()) == [
        ".part-00002.parquet.tmp",
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    table = read_spans(parts)
    assert [(r["name"], r["start_ns"]) for r in table.to_pylist()] == [
        (f"span-{i}", i) for i in range(5)
    ]
    assert run_metadata(read_spans(parts)) == {"run": "crash", "schema_version": SCHEMA_VERSION}
    with pytest.raises(FileExistsError, match="holds parts of another run"):
        TraceWriter(path)


def test_the_timer_flushes_rows_older_than_the_interval(tmp_path):
    path = tmp_path / "trace.parquet"
    part = tmp_path / "trace.parquet.parts" / "part-00000.parquet"
    with TraceWriter(path, flush_spans=1000, flush_interval_s=0.05) as writer:
        writer.append(rows(0, 2))
        deadline_s = time.monotonic() + 10
        while not part.exists() and time.monotonic() < deadline_s:
            time.sleep(0.01)

        assert read_spans(part).to_pylist() == rows(0, 2)
        assert writer.rows_written == 2


def test_read_trace_missing_path_names_it(tmp_path):
    path = tmp_path / "nope.parquet"
    with pytest.raises(TraceFileError) as excinfo:
        read_spans(path)
    assert str(excinfo.value) == f"{path}: does not exist"
    assert excinfo.value.path == str(path)


def test_read_trace_non_parquet_bytes_names_the_file(tmp_path):
    path = tmp_path / "trace.parquet"
    path.write_bytes(b"this is not parquet at all")
    with pytest.raises(TraceFileError) as excinfo:
        read_spans(path, format="ttft")
    assert str(excinfo.value).startswith(f"{path}: not a readable Parquet file (")
    with pytest.raises(TraceFileError) as excinfo:
        read_spans(path)  # guessed: no format recognises it
    assert str(excinfo.value).startswith(f"{path}: not a trace format ttft reads; expected")


def test_read_trace_parquet_without_ttft_metadata_names_the_file(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(to_span_table(rows(0, 2)), path)
    with pytest.raises(TraceFileError) as excinfo:
        run_metadata(read_spans(path))
    assert str(excinfo.value) == (
        f"{path}: no ttft run metadata (key-value key 'ttft'); not a ttft trace"
    )


def write_with_metadata(path: Path, table: pa.Table, metadata: dict) -> None:
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(metadata)}), path)


def test_read_trace_missing_columns_are_named(tmp_path):
    path = tmp_path / "trace.parquet"
    table = to_span_table(rows(0, 2)).drop_columns(["clock", "attributes"])
    write_with_metadata(path, table, {"schema_version": SCHEMA_VERSION})
    with pytest.raises(TraceFileError) as excinfo:
        read_spans(path)
    assert str(excinfo.value) == f"{path}: missing column(s): clock, attributes"


def test_read_trace_rejects_a_newer_schema_version(tmp_path):
    path = tmp_path / "trace.parquet"
    write_with_metadata(path, to_span_table(rows(0, 1)), {"schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(TraceFileError) as excinfo:
        read_spans(path)
    assert str(excinfo.value) == (
        f"{path}: schema_version {SCHEMA_VERSION + 1} is newer than this ttft supports "
        f"({SCHEMA_VERSION}); upgrade ttft"
    )


def test_read_trace_keeps_rows_with_bad_values_for_analysis_to_count(tmp_path):
    # A reader never drops or rejects rows: analysis counts them as data-quality defects.
    path = tmp_path / "trace.parquet"
    table = pa.Table.from_pylist(rows(0, 3) + [span_row(3, stage=None)])
    write_with_metadata(path, table, {"schema_version": SCHEMA_VERSION})
    back = read_spans(path)
    assert back.num_rows == 4
    assert back.column("stage").to_pylist()[3] is None


def test_read_trace_empty_directory_names_it(tmp_path):
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / ".part-00000.parquet.tmp").write_bytes(b"")
    with pytest.raises(TraceFileError) as excinfo:
        read_spans(tmp_path / "parts")
    assert str(excinfo.value) == (
            f"{tmp_path / 'parts'}: directory holds no ttft trace (no .parquet files, no "
            "<name>.parts directories of unfinished runs)")


def test_set_metadata_rejects_values_json_cannot_hold(tmp_path):
    with TraceWriter(tmp_path / "t.parquet") as writer:
        with pytest.raises(TypeError, match="^metadata 'when': "):
            writer.set_metadata(when=object())
    assert os.listdir(tmp_path) == ["t.parquet"]


def test_iter_batches_yields_every_row_lazily(tmp_path):
    path = tmp_path / "trace.parquet"
    table = pa.Table.from_pylist(rows(0, 3) + [span_row(3, start_ns=None)])
    write_with_metadata(path, table, {"schema_version": SCHEMA_VERSION})
    batches = list(iter_batches(path, batch_rows=2))
    assert [b.num_rows for b in batches] == [2, 2]
    assert batches[0].to_pylist() == rows(0, 2)
    assert batches[1].column("start_ns").to_pylist()[1] is None


def test_concurrent_appends_and_timed_flushes_keep_every_row(tmp_path):
    path = tmp_path / "trace.parquet"
    with TraceWriter(path, flush_spans=37, flush_interval_s=0.001) as writer:
        threads = [
            threading.Thread(
                target=lambda k=k: [writer.append([span_row(k * 1000 + i)]) for i in range(300)]
            )
            for k in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    names = read_spans(path).column("name").to_pylist()
    assert sorted(names) == sorted(f"span-{k * 1000 + i}" for k in range(8) for i in range(300))
    assert writer.rows_written == 2400


def test_an_initial_part_makes_a_trace_readable_before_the_first_flush(tmp_path):
    path = tmp_path / "trace.parquet"
    writer = TraceWriter(path, metadata={"run": "early"}, flush_interval_s=None,
                         initial_part=True)
    parts = tmp_path / "trace.parquet.parts"
    assert sorted(p.name for p in parts.iterdir()) == ["part-00000.parquet"]
    early = read_spans(path)  # a process killed now leaves this
    assert early.num_rows == 0 and run_metadata(early)["run"] == "early"
    writer.append(rows(0, 3))
    writer.flush()
    assert sorted(p.name for p in parts.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    writer.close()
    assert read_spans(path).to_pylist() == rows(0, 3)


def _groups_file(path: Path, groups: int, rows_each: int) -> pa.Table:
    import pyarrow.compute as pc

    n = groups * rows_each
    i = pa.array(range(n), pa.int64())
    hex32 = pc.utf8_lpad(pc.cast(i, pa.string()), 32, "0")
    table = pa.table({
        "trace_id": hex32, "span_id": pc.utf8_slice_codeunits(hex32, 16),
        "parent_id": pa.nulls(n, pa.string()), "request_id": pa.nulls(n, pa.string()),
        "name": pa.array(["span"] * n), "stage": pa.array(["queue"] * n).dictionary_encode(),
        "start_ns": i, "end_ns": pc.add(i, 1),
        "clock": pa.array(["host:a"] * n).dictionary_encode(),
        "service": pa.array(["engine"] * n).dictionary_encode(),
        "attributes": pa.array(['{"i":1}'] * n)})
    metadata = {METADATA_KEY: json.dumps({"schema_version": SCHEMA_VERSION}).encode()}
    pq.write_table(table.replace_schema_metadata(metadata), path, row_group_size=rows_each)
    return table


@pytest.mark.parametrize("batch_bytes, later", [
    (None, [65_536, 4_464]), (1 << 10, [65_536, 4_464]), (128 << 20, [70_000])])
def test_a_whole_trace_is_read_in_batches_as_large_as_its_rows_allow(tmp_path, monkeypatch,
                                                                     batch_bytes, later):
    """``read_spans`` reads a file's first row group in batches of 65,536 rows, then each
    later group in batches of as many rows as ``READ_BATCH_BYTES`` holds at the bytes its
    rows decoded to so far (a trace's ~100-byte spans: the whole group), never fewer than
    65,536; the rows are the file's either way. A lazy read keeps the rows it was asked."""
    from ttft.collectors import parquet

    monkeypatch.setattr(parquet, "READ_BATCH_BYTES", batch_bytes)
    path = tmp_path / "groups.parquet"
    table = _groups_file(path, 3, 70_000)
    back = read_spans(path)
    assert [len(c) for c in back.column("start_ns").chunks] == [65_536, 4_464] + later * 2
    assert back.column("start_ns").to_pylist() == table.column("start_ns").to_pylist()
    assert back.column("trace_id").to_pylist() == table.column("trace_id").to_pylist()
    assert [b.num_rows for b in iter_batches(path, batch_rows=50_000)] == [
        50_000, 20_000] * 3
