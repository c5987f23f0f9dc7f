"""Run metadata of several runs read as one trace (``tracer.schema.counted_sums``): the defects
each run counted are summed, never the newest run's alone."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ttft.collectors import read_spans, run_metadata, write_trace
from ttft.collectors.parquet import read_parquet_metadata
from ttft.collectors.synthetic import generate
from ttft.reports.cli import app
from ttft.tracer.schema import EXAMPLES, counted_sums


def test_a_directory_of_runs_counts_every_run_s_rejected_spans(tmp_path):
    """Three runs in one directory (as ``ttft collect -o DIR`` leaves them), the first two
    with spans their collector rejected: analyze counts 4 + 3, not the newest run's 0;
    the rest of the metadata is still the newest run's."""
    for i, count in enumerate([4, 3, 0]):
        meta = {"workload": {"run": i}}
        if count:
            meta["rejected"] = {"count": count, "examples": [f"run {i}: span {k}"
                                                             for k in range(count)]}
            meta["skipped_events"] = {"tool_call": count}
        write_trace(tmp_path / f"run{i}.parquet", generate(10, seed=i).table, meta)
    meta = run_metadata(read_spans(tmp_path))
    assert meta["workload"] == {"run": 2}
    assert meta["rejected"]["count"] == 7
    assert meta["rejected"]["examples"] == sorted(
        [f"run 0: span {k}" for k in range(4)] + [f"run 1: span {k}" for k in range(3)])
    assert meta["skipped_events"] == {"tool_call": 7}
    # the footers alone give the same answer as reading the rows (before: the last run's)
    assert read_parquet_metadata(tmp_path) == meta
    result = CliRunner().invoke(app, ["analyze", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["quality"]["rejected_span"] == 7


def test_counted_sums_ignore_what_the_analysis_ignores():
    """Malformed counts (a string, a bool, a negative number, a non-mapping) are left out,
    as ``analysis.quality`` would read them as none; examples are the smallest distinct."""
    runs = [
        {"rejected": {"count": 2, "examples": ["b", "a"]}},
        {"rejected": {"count": "3", "examples": ["z"]}},
        {"rejected": {"count": True}},
        {"rejected": {"count": -1}},
        {"rejected": [1, 2]},
        {"rejected": {"count": 1, "examples": ["a", *map(str, range(20))]}},
        {"estimated": {"count": 5}},
        {"skipped_events": {"x": 1, "y": "2"}},
        {"skipped_events": ["x"]},
        {},
    ]
    sums = counted_sums(runs)
    assert sums["rejected"]["count"] == 3
    assert sums["rejected"]["examples"] == sorted({"a", "b", *map(str, range(20))})[:EXAMPLES]
    assert sums["estimated"] == {"count": 5, "examples": []}
    assert sums["skipped_events"] == {"x": 1}
    assert counted_sums([{}, {"model": "m"}]) == {}
