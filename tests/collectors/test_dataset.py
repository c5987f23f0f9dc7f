"""Partitioned trace datasets on disk (collectors/dataset.py): every row owned once, borrowed
rows after a partition's own, metadata and rejections only where they count, the dataset
file written last, and URLs through fsspec."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pyarrow as pa
import pytest

from ttft.collectors import (
    DATASET_FILE,
    TraceFileError,
    dataset_info,
    is_dataset,
    read_partition,
    read_spans,
    run_metadata,
    span_rows,
    to_span_table,
    write_dataset,
)
from ttft.tracer.schema import METADATA_KEY, SCHEMA_VERSION, SPAN_SCHEMA

REJECTED = {"count": 2, "examples": ["a span with no id", "a span with no start"]}


def _table(n: int = 12) -> pa.Table:
    rows = [
        row for i in range(n)
        for row in span_rows(f"span{i}", trace_id=f"{i // 3 + 1:032x}", span_id=f"{i + 1:016x}",
                             parent_id=None, start_ns=1_000 * i, end_ns=1_000 * i + 500,
                             clock="c", service="s", request_id=f"r{i // 3}")
    ]
    table = to_span_table(rows)
    return table.replace_schema_metadata(
        {METADATA_KEY: json.dumps({"source": "test", "rejected": REJECTED}).encode()})


def _sorted(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda row: row["span_id"])


def _write(out, table, partitions=3, copies=((0, 2), (4, 0))):
    owner = (np.arange(table.num_rows) // 3) % partitions
    copy_rows = np.array([row for row, _ in copies], dtype=np.int64)
    copy_partitions = np.array([k for _, k in copies], dtype=np.int32)
    return write_dataset(out, table, owner.astype(np.int32), copy_rows, copy_partitions,
                         partitions, "request id, else trace id")


def test_round_trip_owns_every_row_once(tmp_path):
    table = _table()
    out = _write(tmp_path / "ds", table)
    assert is_dataset(out) and (out / DATASET_FILE).is_file()
    info = dataset_info(out)
    assert (info["format"], info["version"], info["partitions"]) == ("ttft-dataset", 1, 3)
    assert (info["spans"], info["copies"], info["schema_version"]) == (12, 2, SCHEMA_VERSION)
    assert info["key"] == "request id, else trace id"
    owned = []
    for k in range(3):
        part, own = read_partition(out, k)
        assert part.schema.equals(SPAN_SCHEMA, check_metadata=False)
        owned.extend(part.slice(0, own).to_pylist())
        borrowed = part.slice(own).column("span_id").to_pylist()
        expected = {0: ["0000000000000005"], 2: ["0000000000000001"]}.get(k, [])
        assert borrowed == expected
    assert sorted(owned, key=lambda r: r["span_id"]) == _sorted(table)
    whole = read_spans(out)
    assert _sorted(whole) == _sorted(table)
    assert not (out / "part=1" / "borrowed.parquet").exists()


def test_empty_partitions_have_their_directory(tmp_path):
    table = _table(6)
    out = _write(tmp_path / "ds", table, partitions=5, copies=())
    assert sorted(p.name for p in out.iterdir()) == [
        DATASET_FILE, "part=0", "part=1", "part=2", "part=3", "part=4"]
    for k in (2, 3, 4):
        part, own = read_partition(out, k)
        assert (part.num_rows, own) == (0, 0)
        assert (out / f"part={k}" / "spans.parquet").is_file()
    assert read_spans(out).num_rows == 6
    with pytest.raises(ValueError, match="no partition 5"):
        read_partition(out, 5)


def test_rejected_only_in_partition_zero(tmp_path):
    out = _write(tmp_path / "ds", _table())
    metas = [run_metadata(read_partition(out, k)[0]) for k in range(3)]
    assert metas[0]["rejected"] == REJECTED
    assert all("rejected" not in meta for meta in metas[1:])
    assert all(meta["source"] == "test" for meta in metas)
    assert all(meta["schema_version"] == SCHEMA_VERSION for meta in metas)
    assert run_metadata(read_spans(out))["rejected"] == REJECTED
    assert dataset_info(out)["metadata"]["rejected"] == REJECTED


def test_refuses_a_non_empty_target(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "x").write_text("")
    with pytest.raises(ValueError, match="ds: exists and is not an empty directory"):
        _write(tmp_path / "ds", _table())
    (tmp_path / "empty").mkdir()
    assert is_dataset(_write(tmp_path / "empty", _table()))


def test_bad_owner_arrays_are_refused(tmp_path):
    table = _table(3)
    with pytest.raises(ValueError, match="owner has 2 entries for 3 rows"):
        write_dataset(tmp_path / "a", table, np.zeros(2, np.int32), np.zeros(0, np.int64),
                      np.zeros(0, np.int32), 1, "k")
    with pytest.raises(ValueError, match="owner holds a value outside 0..1"):
        write_dataset(tmp_path / "b", table, np.full(3, 2, np.int32), np.zeros(0, np.int64),
                      np.zeros(0, np.int32), 2, "k")
    with pytest.raises(ValueError, match="copy_rows holds a value outside"):
        write_dataset(tmp_path / "c", table, np.zeros(3, np.int32), np.array([3]),
                      np.array([0]), 1, "k")


def test_half_written_dataset_is_an_error_not_a_trace(tmp_path):
    """Without its dataset file (written last), the part=K/ directories are not read as a
    plain directory of runs, nor as a smaller trace: reading names the missing file."""
    out = _write(tmp_path / "ds", _table())
    (out / DATASET_FILE).unlink()
    assert not is_dataset(out)
    with pytest.raises(TraceFileError, match=f"ds/{DATASET_FILE}: missing") as caught:
        read_spans(out)
    assert "\n" not in str(caught.value)
    with pytest.raises(TraceFileError, match="missing"):
        read_partition(out, 0)


@pytest.mark.parametrize(("contents", "reason"), [
    ("{not json", "not valid JSON"),
    ('{"format": "other", "version": 1, "partitions": 1}', "not a ttft dataset file"),
    ('{"format": "ttft-dataset", "version": 2, "partitions": 1, "schema_version": 1}',
     "version 2 is newer than this ttft supports"),
    ('{"format": "ttft-dataset", "version": 1, "partitions": 0, "schema_version": 1}',
     "partitions must be a positive integer"),
])
def test_bad_dataset_file_is_one_trace_file_error(tmp_path, contents, reason):
    out = _write(tmp_path / "ds", _table())
    (out / DATASET_FILE).write_text(contents)
    for read in (dataset_info, read_spans, lambda path: read_partition(path, 0)):
        with pytest.raises(TraceFileError, match=reason) as caught:
            read(out)
        assert str(caught.value).startswith(str(out / DATASET_FILE))
        assert "\n" not in str(caught.value)


def test_a_missing_partition_file_is_named(tmp_path):
    out = _write(tmp_path / "ds", _table())
    (out / "part=1" / "spans.parquet").unlink()
    with pytest.raises(TraceFileError, match=r"part=1/spans\.parquet: does not exist"):
        read_spans(out)


def test_memory_filesystem_round_trip():
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://ttft-test-{uuid.uuid4().hex}/ds"
    table = _table()
    try:
        assert _write(url, table) == url
        assert is_dataset(url) and dataset_info(url)["partitions"] == 3
        part, own = read_partition(url, 0)
        assert (own, part.num_rows) == (6, 7)
        assert _sorted(read_spans(url)) == _sorted(table)
        assert run_metadata(read_spans(url))["rejected"] == REJECTED
        with pytest.raises(ValueError, match="exists and is not an empty directory"):
            _write(url, table)
        fs = fsspec.filesystem("memory")
        fs.rm(url.removeprefix("memory://") + f"/{DATASET_FILE}")
        with pytest.raises(TraceFileError, match="missing"):
            read_spans(url)
    finally:
        fsspec.filesystem("memory").rm(url.removeprefix("memory://").rsplit("/", 1)[0],
                                       recursive=True)


def test_file_url_round_trip(tmp_path):
    pytest.importorskip("fsspec")
    url = f"file://{tmp_path}/ds"
    table = _table()
    _write(url, table)
    assert is_dataset(tmp_path / "ds")  # the same files, read without fsspec
    assert _sorted(read_spans(url)) == _sorted(read_spans(tmp_path / "ds")) == _sorted(table)
    part, own = read_partition(url, 2)
    assert part.slice(own).column("span_id").to_pylist() == ["0000000000000001"]


def test_a_url_that_holds_no_dataset(tmp_path):
    pytest.importorskip("fsspec")
    with pytest.raises(TraceFileError, match="not a partitioned dataset"):
        read_spans(f"file://{tmp_path}/nothing")


def test_a_writer_of_many_partitions_joins_each_file_s_pieces(tmp_path, monkeypatch):
    """Rows put a few at a time into more partitions than the writer keeps files open
    (cut to 2): each file is closed and reopened as pieces, joined at the end into one
    file holding every row put into it, with no temporary left."""
    from ttft.collectors import dataset_write

    monkeypatch.setattr(dataset_write, "_MAX_OPEN", 2)
    monkeypatch.setattr(dataset_write, "_BUFFER_BYTES", 1)  # every put is written at once
    table = _table(40)
    writer = dataset_write.DatasetWriter(tmp_path / "ds", 5, "test", {"source": "test"})
    for start in range(0, 40, 2):
        rows = table.slice(start, 2)
        k = (start // 2) % 5
        writer.put(k, rows, rows if k == 3 else None)
    writer.close()
    for k in range(5):
        own = [r for i, r in enumerate(table.to_pylist()) if (i // 2) % 5 == k]
        read, count = read_partition(tmp_path / "ds", k)
        assert _sorted(read.slice(0, count)) == sorted(own, key=lambda r: r["span_id"])
        assert _sorted(read.slice(count)) == (sorted(own, key=lambda r: r["span_id"])
                                              if k == 3 else [])
    assert not list((tmp_path / "ds").glob("part=*/.*"))
    assert dataset_info(tmp_path / "ds")["spans"] == 40
