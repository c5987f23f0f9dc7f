"""``ttft partition``: a dataset built from traces, read back by analyze as the same trace."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from ttft.collectors import dataset_info, read_partition, read_spans, run_metadata
from ttft.reports.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "t.parquet"
    result = runner.invoke(app, ["synth", "--requests", "120", "--seed", "3", "-o", str(path)])
    assert result.exit_code == 0, result.output
    return path


def _analyze_json(path) -> dict:
    result = runner.invoke(app, ["analyze", str(path), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    summary.pop("trace")
    return summary


@pytest.mark.parametrize("partitions", [1, 4])
def test_analyze_of_a_dataset_equals_analyze_of_its_trace(synth, tmp_path, partitions):
    pytest.importorskip("ttft.analysis.partition")
    out = tmp_path / "ds"
    result = runner.invoke(app, ["partition", str(synth), "-o", str(out),
                                 "--partitions", str(partitions)])
    assert result.exit_code == 0, result.output
    line = re.fullmatch(
        rf"wrote {re.escape(str(out))}: {partitions} partitions, 120 requests, ([\d,]+) spans "
        r"\(\+([\d,]+) copied step rows, [\d.]+%\), largest partition ([\d,]+) spans\n",
        result.stderr)
    assert line, result.stderr
    spans = read_spans(synth).num_rows
    assert int(line[1].replace(",", "")) == spans
    info = dataset_info(out)
    assert (info["partitions"], info["spans"]) == (partitions, spans)
    assert int(line[2].replace(",", "")) == info["copies"]
    sizes = [read_partition(out, k)[0].num_rows for k in range(partitions)]
    assert int(line[3].replace(",", "")) == max(sizes)
    assert run_metadata(read_spans(out))["inputs"] == [str(synth)]
    assert _analyze_json(out) == _analyze_json(synth)


def test_a_non_empty_output_is_refused(synth, tmp_path):
    out = tmp_path / "ds"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["partition", str(synth), "-o", str(out), "--partitions", "2"])
    assert result.exit_code == 2
    assert f"{out}: exists and is not an empty directory" in result.output
    assert (out / "keep.txt").read_text() == "mine"


def test_partitions_must_be_positive(synth, tmp_path):
    result = runner.invoke(app, ["partition", str(synth), "-o", str(tmp_path / "ds"),
                                 "--partitions", "0"])
    assert result.exit_code == 2
    assert not (tmp_path / "ds").exists()


def test_an_unreadable_input_is_one_error_line(tmp_path):
    result = runner.invoke(app, ["partition", str(tmp_path / "missing.parquet"), "-o",
                                 str(tmp_path / "ds"), "--partitions", "2"])
    assert result.exit_code == 2
    assert "missing.parquet: does not exist" in result.output
    assert not (tmp_path / "ds").exists()


def test_several_traces_go_into_one_dataset(synth, tmp_path):
    pytest.importorskip("ttft.analysis.partition")
    other = tmp_path / "other.parquet"
    assert runner.invoke(app, ["synth", "--requests", "30", "--seed", "8", "-o",
                               str(other)]).exit_code == 0
    out = tmp_path / "ds"
    result = runner.invoke(app, ["partition", str(synth), str(other), "-o", str(out),
                                 "--partitions", "3"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"wrote {out}: 3 partitions, ")
    whole = read_spans(out)
    assert whole.num_rows == read_spans(synth).num_rows + read_spans(other).num_rows
    assert run_metadata(whole)["inputs"] == [str(synth), str(other)]


def test_analyze_refuses_a_half_written_dataset(synth, tmp_path):
    pytest.importorskip("ttft.analysis.partition")
    out = tmp_path / "ds"
    assert runner.invoke(app, ["partition", str(synth), "-o", str(out),
                               "--partitions", "2"]).exit_code == 0
    (out / "_ttft_dataset.json").unlink()
    result = runner.invoke(app, ["analyze", str(out)])
    assert result.exit_code == 2
    assert "_ttft_dataset.json: missing" in result.output


def test_what_any_input_could_not_find_is_kept(tmp_path):
    """Two Jaeger answers, the second partial: its errors reach the dataset's metadata
    (before: only the first input's metadata was kept)."""
    def answer(trace_id: str, errors) -> dict:
        span = {"traceID": trace_id, "spanID": "00000000000000a1", "operationName": "server",
                "startTime": 1_700_000_000_000_000, "duration": 1000, "processID": "p1",
                "references": [], "tags": [], "logs": []}
        return {"data": [{"traceID": trace_id, "spans": [span],
                          "processes": {"p1": {"serviceName": "api", "tags": []}}}],
                "total": 1, "limit": 0, "offset": 0, "errors": errors}

    clean, partial = tmp_path / "clean.json", tmp_path / "partial.json"
    clean.write_text(json.dumps(answer("0" * 31 + "1", None)))
    partial.write_text(json.dumps(answer("0" * 31 + "2", [{"code": 500, "msg": "shard 3 down"}])))
    out = tmp_path / "ds"
    result = runner.invoke(app, ["partition", str(clean), str(partial), "-o", str(out),
                                 "--partitions", "2"])
    assert result.exit_code == 0, result.output
    assert run_metadata(read_spans(out))["query_errors"] == ["code 500: shard 3 down"]


def test_every_input_s_metadata_counts_and_none_stands_for_all(tmp_path):
    """Two inputs, each with spans its importer rejected and on its own device: the dataset
    counts both inputs' rejected spans (before: the first input's 3 alone, so analyze
    said 3 where the inputs held 5), keeps what they agree on, and keeps the device per
    input under ``differs`` instead of the first's for every request."""
    from ttft.collectors import write_trace
    from ttft.collectors.synthetic import generate

    paths = []
    for i, (count, gpu) in enumerate([(3, "H100"), (2, "H200")]):
        path = tmp_path / f"in{i}.parquet"
        rejected = {"count": count, "examples": [f"in{i}: span {k}" for k in range(count)]}
        write_trace(path, generate(20, seed=i).table,
                    {"engine": {"name": "synthetic"}, "device": {"name": gpu},
                     "rejected": rejected, "skipped_events": {"tool_call": i + 1}})
        paths.append(path)
    out = tmp_path / "ds"
    result = runner.invoke(app, ["partition", *map(str, paths), "-o", str(out),
                                 "--partitions", "2"])
    assert result.exit_code == 0, result.output
    meta = run_metadata(read_spans(out))
    assert meta["engine"] == {"name": "synthetic"}
    assert "device" not in meta
    assert meta["differs"]["device"] == {str(paths[0]): {"name": "H100"},
                                         str(paths[1]): {"name": "H200"}}
    assert meta["rejected"] == {"count": 5, "examples": sorted(
        [f"in0: span {k}" for k in range(3)] + [f"in1: span {k}" for k in range(2)])}
    assert meta["skipped_events"] == {"tool_call": 3}
    assert _analyze_json(out)["quality"]["rejected_span"] == 5
    # Partitioned again with a third input: the devices already told apart stay so
    # (before: the first dataset's `differs` was dropped with its per-input devices).
    third = tmp_path / "in2.parquet"
    write_trace(third, generate(20, seed=2).table,
                {"engine": {"name": "synthetic"}, "device": {"name": "H200"}})
    again = tmp_path / "ds2"
    result = runner.invoke(app, ["partition", str(out), str(third), "-o", str(again),
                                 "--partitions", "3"])
    assert result.exit_code == 0, result.output
    meta = run_metadata(read_spans(again))
    assert meta["engine"] == {"name": "synthetic"} and "device" not in meta
    assert meta["differs"]["device"] == {str(paths[0]): {"name": "H100"},
                                         str(paths[1]): {"name": "H200"},
                                         str(third): {"name": "H200"}}
    assert meta["rejected"]["count"] == 5
    assert _analyze_json(again)["quality"]["rejected_span"] == 5


def test_agreement_is_json_s():
    """Inputs agree where their values are the same JSON: NaN agrees with itself, ``true``
    is not ``1``, and two inputs of one name are both kept."""
    from ttft.reports.cli.partition import merged_metadata

    nan = float("nan")
    merged = merged_metadata([("a", {"x": nan, "flag": True, "d": {"p": 1, "q": 2}}),
                              ("a", {"x": nan, "flag": 1, "d": {"q": 2, "p": 1}})])
    assert merged["d"] == {"p": 1, "q": 2} and "x" in merged and "flag" not in merged
    assert merged["differs"] == {"flag": {"a": True, "a#2": 1}}
    assert merged["inputs"] == ["a", "a#2"]
    alone = merged_metadata([("only", {"x": nan})])
    assert "differs" not in alone and "x" in alone


@pytest.mark.parametrize("streamed", [True, False])
def test_collect_into_a_dataset_sums_the_dataset_s_and_each_staged_run_s_counts(
        tmp_path, monkeypatch, streamed):
    """What ``ttft collect --partitions`` does at its stop (``finish_staging``): the
    dataset's counted defects and those of every run staged into it are summed, the
    newest run's other metadata kept; streamed (the in-memory write is never called), and
    read whole as when the mapping changes the spans, alike."""
    from ttft.collectors import write_trace
    from ttft.collectors.staging import holding, recover, staging_path
    from ttft.collectors.synthetic import generate
    from ttft.reports.runs import partitioned
    from ttft.reports.runs.partitioned import finish_staging

    first = tmp_path / "in.parquet"
    rows = 0
    write_trace(first, generate(20, seed=0).table,
                {"workload": {"run": 0}, "rejected": {"count": 3, "examples": ["a", "b"]}})
    ds = tmp_path / "ds"
    result = runner.invoke(app, ["partition", str(first), "-o", str(ds), "--partitions", "2"])
    assert result.exit_code == 0, result.output
    staging = staging_path(ds)
    staging.mkdir()
    for i, count in ((1, 2), (2, 0)):
        meta = {"workload": {"run": i}}
        if count:
            meta["rejected"] = {"count": count, "examples": ["c"]}
        table = generate(10, seed=i).table
        rows += table.num_rows
        write_trace(staging / f"collect-{i}.parquet", table, meta)
    rows += read_spans(first).num_rows
    if streamed:
        def whole(*_args, **_kwargs):
            raise AssertionError("read whole")
        monkeypatch.setattr(partitioned, "write_partitioned", whole)
    else:
        monkeypatch.setattr(partitioned, "_staged_streamed", lambda *_args: None)
    with holding(ds):
        recover(ds)
        written = finish_staging(ds, 2)
    assert written is not None and written.spans == rows
    meta = run_metadata(read_spans(ds))
    assert meta["inputs"] == [str(first), "_incoming/collect-1.parquet",
                              "_incoming/collect-2.parquet"]
    assert meta["workload"] == {"run": 2}
    assert meta["rejected"] == {"count": 5, "examples": ["a", "b", "c"]}
    assert _analyze_json(ds)["quality"]["rejected_span"] == 5


# --- streamed: read twice a batch at a time, the same dataset ------------------------------

def _partition_rows(path, k: int) -> list[dict]:
    table, own = read_partition(path, k)
    key = lambda row: (row["trace_id"], row["span_id"] or "", row["name"], row["start_ns"])  # noqa: E731
    return [sorted(table.slice(0, own).to_pylist(), key=key),
            sorted(table.slice(own).to_pylist(), key=key)]


def test_a_streamed_dataset_holds_what_the_whole_table_s_holds(synth, tmp_path):
    """``ttft partition`` of a ttft trace streams it (``stream_partitioned``); the dataset
    holds, partition by partition, the rows the in-memory path writes of the whole table."""
    from ttft.reports.runs.partitioned import write_partitioned

    streamed, whole = tmp_path / "streamed", tmp_path / "whole"
    result = runner.invoke(app, ["partition", str(synth), str(synth), "-o", str(streamed),
                                 "--partitions", "3"])
    assert result.exit_code == 0, result.output
    assert "whole" not in result.stderr
    import pyarrow as pa

    from ttft.reports.cli.partition import merged_metadata

    table = read_spans(synth)
    meta = run_metadata(table)
    write_partitioned(whole, pa.concat_tables([table, table]), 3,
                      merged_metadata([(str(synth), meta), (str(synth), meta)]))
    a, b = dataset_info(streamed), dataset_info(whole)
    assert {k: a[k] for k in ("spans", "copies", "metadata", "partitions", "key")} == \
        {k: b[k] for k in ("spans", "copies", "metadata", "partitions", "key")}
    for k in range(3):
        assert _partition_rows(streamed, k) == _partition_rows(whole, k)
    again = tmp_path / "again"  # a dataset streams too, partition by partition
    result = runner.invoke(app, ["partition", str(streamed), "-o", str(again),
                                 "--partitions", "2"])
    assert result.exit_code == 0, result.output
    assert _analyze_json(again) == _analyze_json(streamed)


def test_spans_the_stage_mapping_changes_are_read_whole(synth, tmp_path):
    """A trace holding another system's spans (the built-in mapping maps ``vllm_queue``)
    is not streamed, says so, and is partitioned whole, mapped."""
    import pyarrow as pa

    from ttft.collectors import write_trace

    table = read_spans(synth)
    row = table.slice(0, 1).to_pylist()[0]
    row.update(name="vllm_queue", stage="other", span_id="00000000000000ff")
    mixed = pa.concat_tables([table, pa.Table.from_pylist([row], schema=table.schema)])
    path = tmp_path / "mixed.parquet"
    write_trace(path, mixed, run_metadata(table))
    out = tmp_path / "ds"
    result = runner.invoke(app, ["partition", str(path), "-o", str(out), "--partitions", "2"])
    assert result.exit_code == 0, result.output
    assert "the stage mapping maps some of its spans: reading the traces whole" in result.stderr
    stages = read_spans(out).column("stage").to_pylist()
    assert stages.count("queue") == table.column("stage").to_pylist().count("queue") + 1


def test_runs_a_mapping_joins_only_together_are_read_whole(synth, tmp_path):
    """Two runs of one directory, each left as it is by the built-in mapping alone, that
    its Mooncake join (a sender span's ``bootstrap_room`` matched to a request's) changes
    when read together: the directory is not streamed, and the sender's transfer lands
    with its request, as reading it whole puts it."""
    import pyarrow as pa

    from ttft.collectors import write_trace
    from ttft.collectors.importers.mapping import default_mapping
    from ttft.tracer.schema import SPAN_SCHEMA

    rows = read_spans(synth).to_pylist()
    server = next(r for r in rows if r["stage"] == "server")
    server["attributes"] = json.dumps({**json.loads(server["attributes"] or "{}"),
                                       "bootstrap_room": 7})
    t0, host = server["start_ns"], server["clock"]
    sender = pa.Table.from_pylist([
        {"trace_id": "ab" * 16, "span_id": "00000000000000a1", "parent_id": None,
         "request_id": None, "name": "Sender Req 0x7", "stage": "other", "start_ns": t0 + 1000,
         "end_ns": t0 + 90_000_000, "clock": host, "service": "sglang",
         "attributes": json.dumps({"module": "sglang::mooncake", "rid": "0x7",
                                   "bootstrap_room": 7})},
        {"trace_id": "ab" * 16, "span_id": "00000000000000a2", "parent_id": "00000000000000a1",
         "request_id": None, "name": "mooncake_send", "stage": "kv_transfer",
         "start_ns": t0 + 2000, "end_ns": t0 + 80_000_000, "clock": host, "service": "sglang",
         "attributes": "{}"}], schema=SPAN_SCHEMA)
    runs = tmp_path / "runs"
    runs.mkdir()
    requests = pa.Table.from_pylist(rows, schema=SPAN_SCHEMA)
    write_trace(runs / "a.parquet", requests, {"source": "a"})
    write_trace(runs / "b.parquet", sender, {"source": "b"})
    rules = default_mapping()
    assert rules.apply(requests) is requests and rules.apply(sender) is sender
    assert not rules.inert(sender) and rules.inert(requests)
    out = tmp_path / "ds"
    result = runner.invoke(app, ["partition", str(runs), "-o", str(out), "--partitions", "4"])
    assert result.exit_code == 0, result.output
    assert "reading the traces whole" in result.stderr
    assert ", 120 requests," in result.stderr  # the sender is the request's, not one more
    (k,) = {k for k in range(4) for r in read_partition(out, k)[0].to_pylist()
            if r["trace_id"] in ("ab" * 16, server["trace_id"])}


def test_more_partitions_than_open_files_allowed(synth, tmp_path, monkeypatch):
    """A dataset of more partitions than the writer keeps files open (its own limit cut
    to 3 here, every partition written in several pieces by 1 kB buffers) is written
    and reads back as the trace, whole and streamed."""
    from ttft.collectors import dataset_write

    monkeypatch.setattr(dataset_write, "_MAX_OPEN", 3)
    monkeypatch.setattr(dataset_write, "_BUFFER_BYTES", 1 << 10)
    out = tmp_path / "ds"
    result = runner.invoke(app, ["partition", str(synth), "-o", str(out),
                                 "--partitions", "9"])
    assert result.exit_code == 0, result.output
    assert not list(out.glob("part=*/.*"))  # no temporary or piece left
    assert _analyze_json(out) == _analyze_json(synth)
