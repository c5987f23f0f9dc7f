"""The trace writer's span log (collectors/_log.py): what a durable append guarantees, how a
torn or corrupt tail is read, how segments follow parts, and that concurrent durable
appends share fsyncs (group commit)."""

import os
import threading

import pytest
from test_store import NEVER, rows

from ttft.collectors import TraceFileError, TraceWriter, read_inputs, read_spans, run_metadata
from ttft.collectors._log import LogError, read_log
from ttft.tracer.schema import SCHEMA_VERSION


def names(directory):
    return sorted(p.name for p in directory.iterdir())


def test_every_append_is_in_the_log_before_append_returns(tmp_path):
    writer = TraceWriter(tmp_path / "t.parquet", log=True, flush_interval_s=NEVER,
                         metadata={"run": 1})
    writer.append(rows(0, 5), durable=True)
    writer.set_metadata(device="H200")
    writer.append(rows(5, 7))  # not durable: written, not fsynced

    contents = read_log(writer.parts_dir / "log-00000.spans")
    assert (contents.records, contents.torn_bytes) == (3, 0)  # two batches and the metadata
    assert contents.metadata == {"run": 1, "device": "H200", "schema_version": SCHEMA_VERSION}
    table = read_spans(writer.parts_dir)  # no part yet: the log is the trace
    assert table.to_pylist() == rows(0, 7)
    assert run_metadata(table)["device"] == "H200"
    writer.close()
    assert read_spans(tmp_path / "t.parquet").to_pylist() == rows(0, 7)
    assert not writer.parts_dir.exists()


def test_a_segment_is_removed_once_its_part_is_written(tmp_path):
    writer = TraceWriter(tmp_path / "t.parquet", log=True, flush_interval_s=NEVER,
                         flush_spans=4)
    writer.append(rows(0, 4), durable=True)  # due: part 0 written, log 0 removed
    assert names(writer.parts_dir) == ["log-00001.spans", "part-00000.parquet"]
    writer.append(rows(4, 6), durable=True)
    table = read_spans(writer.parts_dir)
    assert table.to_pylist() == rows(0, 6)
    assert read_inputs(table) == [{
        "path": str(writer.parts_dir), "state": "unfinished", "parts": 1, "log_segments": 1,
        "log_records": 1, "torn_bytes": 0, "spans": 6}]
    writer.close()
    assert read_spans(tmp_path / "t.parquet").to_pylist() == rows(0, 6)


def test_a_segment_left_beside_its_part_is_not_read_twice(tmp_path):
    writer = TraceWriter(tmp_path / "t.parquet", log=True, flush_interval_s=NEVER)
    writer.append(rows(0, 3), durable=True)
    saved = (writer.parts_dir / "log-00000.spans").read_bytes()
    writer.flush()
    # a kill between the part's rename and the segment's removal leaves both
    (writer.parts_dir / "log-00000.spans").write_bytes(saved)
    assert read_spans(writer.parts_dir).to_pylist() == rows(0, 3)


@pytest.mark.parametrize("cut", [1, 8, 20])
def test_a_torn_last_record_is_left_out_and_counted(tmp_path, cut):
    writer = TraceWriter(tmp_path / "t.parquet", log=True, flush_interval_s=NEVER)
    writer.append(rows(0, 3), durable=True)
    segment = writer.parts_dir / "log-00000.spans"
    whole = segment.stat().st_size
    writer.append(rows(3, 6), durable=True)
    data = segment.read_bytes()
    torn = data[:whole + cut]  # a kill in the middle of the second record's write
    segment.write_bytes(torn)

    contents = read_log(segment)
    assert (contents.records, contents.torn_bytes) == (1, cut)
    table = read_spans(writer.parts_dir)
    assert table.to_pylist() == rows(0, 3)
    assert read_inputs(table)[0]["torn_bytes"] == cut


def test_a_flipped_byte_ends_the_trusted_records(tmp_path):
    writer = TraceWriter(tmp_path / "t.parquet", log=True, flush_interval_s=NEVER)
    writer.append(rows(0, 3), durable=True)
    segment = writer.parts_dir / "log-00000.spans"
    whole = segment.stat().st_size
    writer.append(rows(3, 6), durable=True)
    writer.append(rows(6, 9), durable=True)
    data = bytearray(segment.read_bytes())
    data[whole + 30] ^= 0xFF  # inside the second record's payload: its crc32 fails
    segment.write_bytes(bytes(data))

    contents = read_log(segment)
    assert contents.records == 1
    assert contents.torn_bytes == len(data) - whole
    assert contents.table.num_rows == 3


def test_a_file_that_is_not_a_log_is_a_clear_error(tmp_path):
    parts = tmp_path / "t.parquet.parts"
    parts.mkdir()
    (parts / "log-00000.spans").write_bytes(b"not a log at all")
    with pytest.raises(LogError, match="bad magic"):
        read_log(parts / "log-00000.spans")
    with pytest.raises(TraceFileError, match=r"log-00000\.spans: not a ttft span log"):
        read_spans(parts)


def test_a_failed_part_keeps_its_rows_in_the_log_and_the_merge_takes_them(tmp_path,
                                                                          monkeypatch):
    import ttft.collectors.writer as writer_module

    writer = TraceWriter(tmp_path / "t.parquet", log=True, flush_interval_s=NEVER)
    writer.append(rows(0, 4), durable=True)
    real = writer_module.write_atomic

    def failing(dest, table, metadata_json):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer_module, "write_atomic", failing)
    with pytest.raises(OSError, match="No space left"):
        writer.flush()
    monkeypatch.setattr(writer_module, "write_atomic", real)
    assert writer.dropped_rows == 0  # nothing lost: the rows are in log 0
    assert names(writer.parts_dir) == ["log-00000.spans", "log-00001.spans"]
    writer.append(rows(4, 6), durable=True)
    assert sorted(r["span_id"] for r in read_spans(writer.parts_dir).to_pylist()) == sorted(
        r["span_id"] for r in rows(0, 6))
    writer.close()
    merged = read_spans(tmp_path / "t.parquet").to_pylist()
    assert sorted(r["span_id"] for r in merged) == sorted(r["span_id"] for r in rows(0, 6))


def test_a_failed_log_write_takes_nothing(tmp_path):
    writer = TraceWriter(tmp_path / "t.parquet", log=True, flush_interval_s=NEVER)
    writer.append(rows(0, 2), durable=True)
    os.close(writer._segment._fd)  # the disk went away under the open segment
    with pytest.raises(OSError):
        writer.append(rows(2, 4), durable=True)
    assert writer._buffered_rows == 2


def test_a_parts_directory_with_a_log_is_another_runs(tmp_path):
    writer = TraceWriter(tmp_path / "t.parquet", log=True, flush_interval_s=NEVER)
    writer.append(rows(0, 2), durable=True)
    with pytest.raises(FileExistsError, match="holds parts of another run"):
        TraceWriter(tmp_path / "t.parquet", log=True)


def test_concurrent_durable_appends_share_fsyncs(tmp_path, monkeypatch):
    """Group commit: while one fsync runs, the appends that arrive wait for the next one,
    which covers them all; every append returns only after an fsync that started after
    its write."""
    import ttft.collectors._log as log_module

    writer = TraceWriter(tmp_path / "t.parquet", log=True, flush_interval_s=NEVER)
    fsyncs = []
    real_fsync = os.fsync
    slow = threading.Event()

    def counted_fsync(fd):
        fsyncs.append(fd)
        slow.wait(0.05)  # a slow disk makes appends pile up behind each fsync (even when
        # a loaded machine runs the senders one after another)
        real_fsync(fd)

    monkeypatch.setattr(log_module.os, "fsync", counted_fsync)
    n_threads, per_thread = 8, 25

    start = threading.Barrier(n_threads)

    def sender(k):
        start.wait(30)
        for j in range(per_thread):
            i = (k * per_thread + j) * 2
            writer.append(rows(i, i + 2), durable=True)

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    appends = n_threads * per_thread
    assert writer._synced == writer._appended == appends
    assert len(fsyncs) < appends / 2  # at least two appends per fsync on average
    writer.close()
    assert read_spans(tmp_path / "t.parquet").num_rows == 2 * appends


def test_a_directory_of_runs_reads_finished_and_unfinished_ones(tmp_path):
    with TraceWriter(tmp_path / "a.parquet", log=True) as first:
        first.append(rows(0, 3), durable=True)
    live = TraceWriter(tmp_path / "b.parquet", log=True, flush_interval_s=NEVER)
    live.append(rows(3, 5), durable=True)
    merged_leftover = tmp_path / "a.parquet.parts"  # a kill after the merge's rename
    merged_leftover.mkdir()

    table = read_spans(tmp_path)
    assert sorted(r["span_id"] for r in table.to_pylist()) == sorted(
        r["span_id"] for r in rows(0, 5))
    assert [(i["path"], i["state"], i["spans"]) for i in read_inputs(table)] == [
        (str(tmp_path / "a.parquet"), "finished", 3),
        (str(tmp_path / "b.parquet.parts"), "unfinished", 2),
    ]
    live.close()
    table = read_spans(tmp_path)
    assert [i["state"] for i in read_inputs(table)] == ["finished", "finished"]
    assert read_inputs(read_spans(tmp_path / "a.parquet")) is None  # one file: nothing to say
