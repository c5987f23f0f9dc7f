"""``ttft collect --partitions N`` (issue 17, item 1): a real collect process on loopback,
fed a synthetic trace over OTLP/HTTP and OTLP/gRPC (each request's client and server traces
in different exports, the engine's step traces with their gpu spans in others), writes a
partitioned dataset at its stop that analyses exactly as the trace does; killed, it leaves a
staging the next collect partitions in, losing nothing it acknowledged; a second collect
into a finished dataset adds its spans.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pytest
from _collect import TIMEOUT_S, CollectProcess
from _kill_senders import grpc_exporter, http_exporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from typer.testing import CliRunner

from ttft.collectors import (
    DATASET_FILE,
    dataset_info,
    read_partition,
    read_spans,
    run_metadata,
    write_trace,
)
from ttft.collectors.staging import STAGING_DIR, holding, next_path, recover, swap_in
from ttft.collectors.synthetic import generate
from ttft.reports.cli import app

REQUESTS = 120
PARTITIONS = 3
GROUPS_PER_EXPORT = 6
runner = CliRunner()


def _any(value) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[_any(item) for item in value]))
    return AnyValue(string_value=str(value))


def _span(row: dict) -> Span:
    """The OTLP span that ``request_to_rows`` turns back into ``row`` (stage, request id
    and clock as ttft's attributes; an event row as a zero-length span of stage event)."""
    attributes = {**json.loads(row["attributes"]), "ttft.stage": row["stage"],
                  "ttft.clock": row["clock"]}
    if row["request_id"] is not None:
        attributes["ttft.request_id"] = row["request_id"]
    return Span(trace_id=bytes.fromhex(row["trace_id"]), span_id=bytes.fromhex(row["span_id"]),
                parent_span_id=bytes.fromhex(row["parent_id"] or ""), name=row["name"],
                start_time_unix_nano=row["start_ns"], end_time_unix_nano=row["end_ns"],
                attributes=[KeyValue(key=k, value=_any(v)) for k, v in attributes.items()])


def _export(groups: list[list[dict]]) -> bytes:
    """One export holding each group (one trace's rows of one service) as a resource."""
    return ExportTraceServiceRequest(resource_spans=[
        ResourceSpans(resource={"attributes": [KeyValue(
            key="service.name", value=AnyValue(string_value=group[0]["service"]))]},
            scope_spans=[ScopeSpans(spans=[_span(row) for row in group])])
        for group in groups]).SerializeToString()


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> tuple[Path, pa.Table, list[bytes]]:
    """The reference trace file, its table, and its exports in a shuffled order: every
    other request's client spans moved to a trace of their own (sharing the request id),
    so client and server are two traces, sent in different exports."""
    table = generate(REQUESTS, seed=7).table
    rows = table.to_pylist()
    for row in rows:
        if row["service"] == "loadgen" and int(row["trace_id"][-1], 16) % 2:
            row["trace_id"] = row["trace_id"][::-1]
            row["parent_id"] = None if row["stage"] == "client" else row["parent_id"]
    table = pa.Table.from_pylist(rows, schema=table.schema)
    path = write_trace(tmp_path_factory.mktemp("ref") / "ref.parquet", table)
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["trace_id"], row["service"]), []).append(row)
    ordered = list(groups.values())
    random.Random(3).shuffle(ordered)
    exports = [_export(ordered[i:i + GROUPS_PER_EXPORT])
               for i in range(0, len(ordered), GROUPS_PER_EXPORT)]
    return path, read_spans(path), exports


def _span_ids(exports: list[bytes]) -> list[str]:
    return sorted(span.span_id.hex() for body in exports
                  for resource in ExportTraceServiceRequest.FromString(body).resource_spans
                  for scope in resource.scope_spans for span in scope.spans)


def _analyze(path: Path) -> dict:
    result = runner.invoke(app, ["analyze", str(path), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    summary.pop("trace")
    return summary


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(tuple(row.values()) for row in table.to_pylist())


def _feed(collect: CollectProcess, exports: list[bytes]) -> None:
    """Send ``exports`` alternately over OTLP/HTTP and OTLP/gRPC; each one is acknowledged
    (answered) before the next is sent."""
    senders = [http_exporter(collect.http_url), grpc_exporter(collect.grpc_url)]
    try:
        for i, body in enumerate(exports):
            senders[i % 2][0](body)
    finally:
        for _, close in senders:
            close()


def _run(out: Path, exports: list[bytes], stop: signal.Signals) -> list[str]:
    """One ``ttft collect -o out --partitions 3`` fed ``exports``, then sent ``stop``; its
    stderr lines after the listening ones (none read for SIGKILL)."""
    collect = CollectProcess(out, "--partitions", str(PARTITIONS))
    try:
        _feed(collect, exports)
        collect.process.send_signal(stop)
        code = collect.process.wait(TIMEOUT_S * 2)
        assert code == (0 if stop == signal.SIGTERM else -signal.SIGKILL)
    finally:
        collect.kill()
    lines = []
    while (line := collect.lines.get(timeout=TIMEOUT_S)) is not None:
        lines.append(line)
    return lines


def _steps(table: pa.Table, stage: str) -> set[tuple[str, int]]:
    """``(service, step_id)`` of the rows of ``stage``: the gpu join's key."""
    return {(row["service"], json.loads(row["attributes"])["step_id"])
            for row in table.filter(pa.compute.equal(table["stage"], stage)).to_pylist()}


def _assert_whole_requests(out: Path, table: pa.Table) -> None:
    """Each request id and trace lies in exactly one partition's own rows, together they
    are every row once, and each partition holds the gpu spans of every step its
    requests' prefill chunks ran in."""
    owner: dict[str, int] = {}
    owned = []
    for k in range(PARTITIONS):
        part, own_rows = read_partition(out, k)
        own = part.slice(0, own_rows)
        owned.append(own)
        for key in set(own.column("request_id").drop_null().to_pylist()) | set(
                own.column("trace_id").to_pylist()):
            assert owner.setdefault(key, k) == k, f"{key} in partitions {owner[key]} and {k}"
        assert _steps(own, "prefill.chunk") <= _steps(part, "gpu"), k
    assert _rows(pa.concat_tables(owned)) == _rows(table)
    assert len(set(owner.values())) == PARTITIONS  # every partition got requests


def test_a_stopped_collect_writes_a_dataset_that_analyses_as_the_trace(tmp_path, trace):
    path, table, exports = trace
    out = tmp_path / "ds"
    lines = _run(out, exports, signal.SIGTERM)
    assert lines[-1].startswith(f"wrote {out}: {PARTITIONS} partitions, {REQUESTS} requests, "
                                f"{table.num_rows:,} spans (+"), lines
    assert sorted(p.name for p in out.iterdir()) == [DATASET_FILE] + [
        f"part={k}" for k in range(PARTITIONS)]  # the staging is gone
    info = dataset_info(out)
    assert (info["partitions"], info["spans"]) == (PARTITIONS, table.num_rows)
    workload = run_metadata(read_spans(out))["workload"]
    assert workload["command"] == "ttft collect"
    (run,) = info["metadata"]["inputs"]
    assert run.startswith(f"{STAGING_DIR}/collect-") and run.endswith(".parquet")
    assert _rows(read_spans(out)) == _rows(table)
    _assert_whole_requests(out, table)
    summary = _analyze(out)
    assert (summary["boundary"], summary["requests_ok"]) == ("client", REQUESTS)
    assert summary == _analyze(path)
    assert int(lines[-1].split("(+")[1].split(" ")[0].replace(",", "")) == info["copies"] > 0


def test_a_killed_collect_is_finished_by_the_next_and_a_second_one_adds_its_spans(
        tmp_path, trace):
    """Four runs into one dataset, the exports cut in three pieces (so requests' client and
    server traces land in different runs): killed with only a staging (analyze names the
    command that finishes it; ttft partition reads the staging); stopped (the first staging
    partitioned in); killed beside a finished dataset (which reads as before); stopped
    without spans (the dataset then holds everything, as the trace analyses)."""
    path, table, exports = trace
    out, third = tmp_path / "ds", len(exports) // 3
    _run(out, exports[:third], signal.SIGKILL)
    assert [p.name for p in out.iterdir()] == [STAGING_DIR]
    result = subprocess.run([sys.executable, "-m", "ttft.reports.cli", "analyze", str(out)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert (f"an unfinished ttft collect --partitions (spans staged in {STAGING_DIR}/): "
            f"finish it with ttft collect -o {out} --partitions N") in result.stderr
    other = tmp_path / "other"
    result = runner.invoke(app, ["partition", str(out / STAGING_DIR), "-o", str(other),
                                 "--partitions", "2"])
    assert result.exit_code == 0, result.output
    first = read_spans(other)
    assert sorted(first.column("span_id").to_pylist()) == _span_ids(exports[:third])

    _run(out, exports[third:2 * third], signal.SIGTERM)
    done = read_spans(out)
    assert set(_rows(first)) <= set(_rows(done)) and done.num_rows < table.num_rows

    _run(out, exports[2 * third:], signal.SIGKILL)
    assert _rows(read_spans(out)) == _rows(done)  # the finished dataset, read as it was
    assert (out / STAGING_DIR).is_dir()
    analysed = runner.invoke(app, ["analyze", str(out)])  # and says what it leaves out
    assert analysed.exit_code == 0, analysed.output
    assert (f"{out / STAGING_DIR}: 1 run of spans a collect staged and has not partitioned "
            f"in (killed, or still running): not in this analysis; ttft collect -o {out} "
            "--partitions ") in analysed.stderr

    result = subprocess.run([sys.executable, "-m", "ttft.reports.cli", "collect", "-o",
                             str(out), "--partitions", str(PARTITIONS), "--http-port", "0",
                             "--grpc-port", "0", "--duration", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (f"{out / STAGING_DIR}: 1 run of an earlier collect, partitioned in at the stop"
            in result.stderr.splitlines()[0]), result.stderr
    assert _rows(read_spans(out)) == _rows(table)  # nothing acknowledged was lost
    assert len(dataset_info(out)["metadata"]["inputs"]) == 4
    assert not (out / STAGING_DIR).exists()
    _assert_whole_requests(out, table)
    assert _analyze(out) == _analyze(path)


@pytest.mark.parametrize(("args", "message"), [
    (["--partitions", "0"], "error: --partitions must be at least 1, not 0"),
    (["--partitions", "-2"], "error: --partitions must be at least 1, not -2"),
])
def test_a_non_positive_partition_count_is_one_line(tmp_path, args, message):
    result = runner.invoke(app, ["collect", "-o", str(tmp_path / "ds"), *args])
    assert (result.exit_code, result.stderr) == (2, message + "\n")


def test_an_output_that_is_a_file_or_another_directory_is_refused(tmp_path):
    file = tmp_path / "f"
    file.write_text("mine")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a.parquet").write_text("")
    for out, why in ((file, "not a directory"),
                     (tmp_path / "runs", "neither a ttft dataset nor empty")):
        result = runner.invoke(app, ["collect", "-o", str(out), "--partitions", "2"])
        assert result.exit_code == 2
        assert result.stderr.startswith(f"error: {out}: {why}") and \
            result.stderr.count("\n") == 1, result.stderr


def test_another_partition_count_than_the_datasets_is_refused(tmp_path, trace):
    out = tmp_path / "ds"
    result = runner.invoke(app, ["partition", str(trace[0]), "-o", str(out),
                                 "--partitions", "2"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["collect", "-o", str(out), "--partitions", "3"])
    assert (result.exit_code, result.stderr) == (
        2, f"error: {out}: a dataset of 2 partitions, not 3; collect into it with "
           "--partitions 2, or into a new directory\n")


def _dataset(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True)
    (folder / DATASET_FILE).write_text(name)
    return folder


def test_the_swap_replaces_the_dataset_and_its_staging(tmp_path):
    out = _dataset(tmp_path / "ds", "old")
    (out / STAGING_DIR).mkdir()
    _dataset(next_path(out), "new")
    swap_in(out)
    assert [(p.name, p.read_text()) for p in out.iterdir()] == [(DATASET_FILE, "new")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


@pytest.mark.parametrize("crash", ["before-swap", "between-renames", "new-complete"])
def test_recover_puts_an_interrupted_swap_right(tmp_path, crash):
    """A crash before the swap keeps the old dataset and its staging; one between the two
    renames of a swap (a filesystem without an atomic exchange) completes it when the new
    dataset was complete and undoes it otherwise."""
    out, prev = tmp_path / "ds", tmp_path / ".ds.ttft-prev"
    _dataset(prev if crash != "before-swap" else out, "old")
    (next_path(out)).mkdir()
    if crash == "new-complete":
        (next_path(out) / DATASET_FILE).write_text("new")
    recover(out)
    assert (out / DATASET_FILE).read_text() == ("new" if crash == "new-complete" else "old")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_a_second_collect_into_a_dataset_being_collected_is_refused(tmp_path):
    out = tmp_path / "ds"
    with holding(out):
        result = runner.invoke(app, ["collect", "-o", str(out), "--partitions", "2"])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {out}: another ttft collect is writing this "
                                    "dataset (it holds "), result.stderr
    assert not out.exists()


def test_a_plain_collect_into_a_dataset_is_refused_and_writes_nothing(tmp_path, trace):
    """No span is acknowledged into a file no reader of the dataset reads (issue 37)."""
    out = tmp_path / "ds"
    result = runner.invoke(app, ["partition", str(trace[0]), "-o", str(out),
                                 "--partitions", "2"])
    assert result.exit_code == 0, result.output
    before = sorted(p.name for p in out.iterdir())
    result = runner.invoke(app, ["collect", "-o", str(out), "--http-port", "0",
                                 "--grpc-port", "0", "--duration", "0"])
    assert (result.exit_code, result.stderr) == (
        2, f"error: {out}: a partitioned dataset; collect into it with --partitions 2 (spans "
           "are staged in it and partitioned in at the stop), or into another directory\n")
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_collect_into_a_dataset_holding_a_foreign_file_keeps_it(tmp_path, trace):
    """The swap replaces the dataset's directory: a trace someone put there is not lost
    with it; the collect is refused before it listens."""
    out = tmp_path / "ds"
    result = runner.invoke(app, ["partition", str(trace[0]), "-o", str(out),
                                 "--partitions", "2"])
    assert result.exit_code == 0, result.output
    stray = out / "collect-1.parquet"
    stray.write_bytes(trace[0].read_bytes())
    result = runner.invoke(app, ["collect", "-o", str(out), "--partitions", "2",
                                 "--http-port", "0", "--grpc-port", "0", "--duration", "0"])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {out}: holds collect-1.parquet, which is not "
                                    "part of the dataset") and result.stderr.count("\n") == 1
    assert stray.read_bytes() == trace[0].read_bytes()
