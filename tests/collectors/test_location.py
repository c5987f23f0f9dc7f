"""A trace location resolved once (collectors/location.py): what lies at a path, whether a
run may be appended there and what to do instead, and the runs appended read back whole."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from ttft.collectors import (
    TraceLocation,
    TraceWriter,
    read_spans,
    span_rows,
    to_span_table,
    write_dataset,
    write_trace,
)
from ttft.collectors.staging import STAGING_DIR


def _table(n: int = 6):
    rows = [row for i in range(n)
            for row in span_rows(f"span{i}", trace_id=f"{i // 3 + 1:032x}",
                                 span_id=f"{i + 1:016x}", parent_id=None, start_ns=1_000 * i,
                                 end_ns=1_000 * i + 500, clock="c", service="s",
                                 request_id=f"r{i // 3}")]
    return to_span_table(rows)


def _dataset(path, partitions=2):
    table = _table()
    owner = np.arange(table.num_rows) % partitions
    write_dataset(path, table, owner, np.array([], np.int64), np.array([], np.int64),
                  partitions, "request id", {"source": "test"})
    return table


def test_every_kind_is_told_apart(tmp_path):
    assert TraceLocation("-").kind == "stream"
    assert TraceLocation(str(tmp_path / "nothing")).kind == "new"
    (tmp_path / "empty").mkdir()
    assert TraceLocation(str(tmp_path / "empty")).kind == "empty"
    write_trace(tmp_path / "one.parquet", _table(), {})
    assert TraceLocation(str(tmp_path / "one.parquet")).kind == "file"
    assert TraceLocation(str(tmp_path)).kind == "runs"
    writer = TraceWriter(tmp_path / "live.parquet", log=True)  # a writer still writing
    try:
        assert TraceLocation(str(tmp_path / "live.parquet")).kind == "run"
        assert TraceLocation(str(tmp_path / "live.parquet.parts")).kind == "run"
    finally:
        writer.close()
    _dataset(tmp_path / "ds")
    assert TraceLocation(str(tmp_path / "ds")).kind == "dataset"
    (tmp_path / "half" / "part=0").mkdir(parents=True)  # a dataset whose writing stopped
    assert TraceLocation(str(tmp_path / "half")).kind == "dataset"
    assert TraceLocation("s3://bucket/ds").kind == "dataset"  # looked at without the network


def test_a_plain_run_is_never_appended_to_a_dataset_or_a_file(tmp_path):
    _dataset(tmp_path / "ds", partitions=3)
    with pytest.raises(ValueError, match="--partitions 3"):
        TraceLocation(str(tmp_path / "ds")).appendable()
    write_trace(tmp_path / "one.parquet", _table(), {})
    with pytest.raises(ValueError, match="not a directory"):
        TraceLocation(str(tmp_path / "one.parquet")).appendable()
    TraceLocation(str(tmp_path)).appendable()  # a directory of runs takes another
    TraceLocation(str(tmp_path / "new")).appendable()


def test_a_dataset_takes_runs_of_its_own_partition_count_only(tmp_path):
    ds = tmp_path / "ds"
    _dataset(ds, partitions=2)
    TraceLocation(str(ds)).appendable(2)
    with pytest.raises(ValueError, match="a dataset of 2 partitions, not 4"):
        TraceLocation(str(ds)).appendable(4)
    (ds / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt, which is not part of the dataset"):
        TraceLocation(str(ds)).appendable(2)
    (tmp_path / "runs").mkdir()
    write_trace(tmp_path / "runs" / "a.parquet", _table(), {})
    with pytest.raises(ValueError, match="neither a ttft dataset nor empty"):
        TraceLocation(str(tmp_path / "runs")).appendable(2)
    (tmp_path / "half" / "part=0").mkdir(parents=True)  # unfinished: never swapped over
    with pytest.raises(ValueError, match="neither a ttft dataset nor empty"):
        TraceLocation(str(tmp_path / "half")).appendable(2)
    (tmp_path / "killed" / STAGING_DIR).mkdir(parents=True)  # a first collect killed
    TraceLocation(str(tmp_path / "killed")).appendable(2)


def test_appended_runs_are_read_back_and_staged_ones_are_named(tmp_path):
    runs = TraceLocation(str(tmp_path / "runs"))
    for _ in range(2):
        writer = runs.writer(flush_interval_s=None)
        writer.append(_table())
        writer.close()
    assert TraceLocation(runs.path).kind == "runs"
    assert read_spans(runs.path).num_rows == 2 * _table().num_rows
    ds = tmp_path / "ds"
    own = _dataset(ds)
    location = TraceLocation(str(ds))
    assert location.staged_runs() == []
    writer = location.writer(staged=True, flush_interval_s=None)
    writer.append(_table(3))
    writer.close()
    assert [p.parent for p in location.staged_runs()] == [ds / STAGING_DIR]
    assert location.read().num_rows == own.num_rows  # staged runs are not in the dataset yet
    assert read_spans(location.staging).num_rows == _table(3).num_rows


def test_it_travels_without_its_table(tmp_path):
    write_trace(tmp_path / "one.parquet", _table(), {"source": "t"})
    path = tmp_path / "one.parquet"
    location = TraceLocation(str(path), table=read_spans(path))
    assert location.kind == "file"
    copy = pickle.loads(pickle.dumps(location))
    assert copy.table is None and copy == location
    assert json.loads(copy.read().schema.metadata[b"ttft"])["source"] == "t"
