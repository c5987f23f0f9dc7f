"""A process writing spans through a ``TraceWriter`` is killed with SIGKILL at a random
moment, often inside a part write: every part file on disk is readable, the spans of every
flush the process reported complete are all there (and nothing else but possibly the one
flush it finished without reporting), a temporary file is never read as a trace part, and
``ttft analyze`` works on the directory.

The child process writes flush ``k`` as a whole synthetic workload (``generate``) whose ids
are made unique to ``k``, one part per flush, and prints ``k + 1`` after each flush
returned. The parent rebuilds the same tables to know exactly which spans each part holds.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ttft.collectors import read_spans
from ttft.collectors.parquet import trace_files
from ttft.collectors.synthetic import generate
from ttft.reports.cli import app
from ttft.tracer.span_ids import is_v2, to_v1

TIMEOUT_S = 60.0

# Shared by the child script and this module (exec'd below), so both build the same rows.
FLUSH_TABLE_SRC = '''
import pyarrow as pa
import pyarrow.compute as pc


def flush_table(unit, k):
    """The rows of flush ``k``: ``unit`` with trace, span and parent ids whose first six hex
    digits are ``k``, request ids prefixed with ``k`` and the engine's service renamed per
    flush (engine steps join their requests by (service, step_id); keep flushes apart)."""
    prefix = f"{k:06x}"
    out = unit
    for name in ("trace_id", "span_id", "parent_id"):
        column = pc.binary_join_element_wise(prefix, pc.utf8_slice_codeunits(unit[name], 6), "")
        out = out.set_column(out.schema.get_field_index(name), name, column)
    request_id = pc.binary_join_element_wise(f"f{k}-", unit["request_id"], "")
    out = out.set_column(out.schema.get_field_index("request_id"), "request_id", request_id)
    service = unit["service"].cast(pa.string())
    service = pc.if_else(pc.equal(service, "engine"), f"engine-{k}", service)
    return out.set_column(out.schema.get_field_index("service"), "service", service)
'''
_helpers: dict = {}
exec(FLUSH_TABLE_SRC, _helpers)  # noqa: S102 - our own source, shared with the child
flush_table = _helpers["flush_table"]

CHILD = FLUSH_TABLE_SRC + '''
import sys
import time

from ttft.collectors import TraceWriter
from ttft.collectors.synthetic import generate

path, requests, flushes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
unit = generate(requests, seed=0).table
# flush_spans = one flush's rows: each append writes exactly one part before returning
writer = TraceWriter(path, metadata={"run": "crash"}, flush_spans=unit.num_rows,
                     flush_interval_s=None, merge_on_close=False)
print("ready", flush=True)
for k in range(flushes):
    writer.append(flush_table(unit, k))
    assert writer.rows_written == (k + 1) * unit.num_rows
    print(k + 1, flush=True)
time.sleep(120)  # the parent kills us long before
'''


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.strip())
    lines.put(None)


def _next_line(lines: queue.Queue) -> str | None:
    try:
        return lines.get(timeout=TIMEOUT_S)
    except queue.Empty:
        raise AssertionError(f"the writer printed nothing for {TIMEOUT_S} s") from None


def _write_then_kill(path: Path, requests: int, kill_after: int, extra_s: float) -> int:
    """Run the writer child, SIGKILL it ``extra_s`` after it reported ``kill_after``
    flushes; returns the number of flushes it reported complete in all."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(requests), str(kill_after + 1000)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(child.stdout, lines), daemon=True)
    reader.start()
    try:
        assert _next_line(lines) == "ready", child.stderr.read() if child.poll() else ""
        for expected in range(1, kill_after + 1):
            line = _next_line(lines)
            assert line == str(expected), (line, child.stderr.read() if child.poll() else "")
        time.sleep(extra_s)
        assert child.poll() is None, child.stderr.read()
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=TIMEOUT_S) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=TIMEOUT_S)
    reader.join(TIMEOUT_S)
    reported = kill_after
    while (line := lines.get_nowait()) is not None:
        assert line == str(reported + 1)
        reported += 1
    assert child.stderr.read() == ""
    child.stdout.close()
    child.stderr.close()
    return reported


@pytest.mark.parametrize(
    "rounds,requests,most_flushes,extra_max_s",
    [
        pytest.param(2, 200, 5, 0.02, id="short"),
        pytest.param(20, 2000, 40, 0.15, id="full", marks=pytest.mark.stress),
    ],
)
def test_a_writer_killed_at_random_keeps_every_reported_flush(
    tmp_path, rounds, requests, most_flushes, extra_max_s
):
    rng = random.Random(1234)
    unit = generate(requests, seed=0).table
    runner = CliRunner()
    leftover_temps = 0
    for round_ in range(rounds):
        path = tmp_path / f"run{round_}" / "trace.parquet"
        path.parent.mkdir()
        kill_after = most_flushes if rounds <= 2 else rng.randint(1, most_flushes)
        reported = _write_then_kill(path, requests, kill_after, rng.uniform(0, extra_max_s))
        parts = tmp_path / f"run{round_}" / "trace.parquet.parts"

        names = sorted(p.name for p in parts.iterdir())
        finished = [n for n in names if not n.startswith(".")]
        # the kill may land after a part's rename but before its line was printed
        assert len(finished) in (reported, reported + 1), (reported, names)
        assert finished == [f"part-{k:05d}.parquet" for k in range(len(finished))]
        temps = [n for n in names if n.startswith(".")]
        # at most the part being written when the kill came, under its temporary name
        assert temps in ([], [f".part-{len(finished):05d}.parquet.tmp"]), names
        leftover_temps += len(temps)

        for k, name in enumerate(finished):  # every part on disk is whole and readable
            part = pq.read_table(parts / name)
            assert part.num_rows == unit.num_rows and is_v2(part.schema)  # ids as bytes
            # the writer groups a part's rows by trace: compare the rows, not their order
            assert _rows(to_v1(part)) == _rows(flush_table(unit, k))

        # a torn temporary part that even starts like Parquet is never taken for a trace part
        (parts / ".part-99999.parquet.tmp").write_bytes(b"PAR1 torn")
        assert [p.name for p in trace_files(parts)] == finished
        table = read_spans(parts)
        expected = pa.concat_tables(flush_table(unit, k) for k in range(len(finished)))
        assert table.num_rows == expected.num_rows == len(finished) * unit.num_rows
        assert _rows(table) == _rows(expected)

        if round_ == rounds - 1 or rounds <= 2:  # the CLI on the crashed directory
            result = runner.invoke(app, ["analyze", str(parts), "--json"])
            assert result.exit_code == 0, result.output
            summary = json.loads(result.stdout)
            assert summary["requests"] == len(finished) * requests
    if rounds > 2:  # kills at random moments do land inside a part write
        assert leftover_temps >= 1


def _rows(table: pa.Table) -> list[tuple]:
    """The ids of every row, sorted (row order within a part is the writer's choice)."""
    cols = [table.column(n).to_pylist() for n in ("trace_id", "span_id", "parent_id", "request_id")]
    return sorted(zip(*cols, strict=True), key=lambda r: tuple(x or "" for x in r))


def test_replace_bytes_swaps_the_whole_file_and_leaves_no_temporary(tmp_path):
    from ttft.collectors.writer import replace_bytes

    dest = tmp_path / "sweep.json"
    replace_bytes(dest, b"first")
    replace_bytes(dest, b"second, longer")
    assert dest.read_bytes() == b"second, longer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]


def test_replace_bytes_that_fails_keeps_the_old_file(tmp_path, monkeypatch):
    import ttft.collectors.layout as files
    from ttft.collectors.writer import replace_bytes

    dest = tmp_path / "sweep.json"
    replace_bytes(dest, b"kept")

    def broken(path):
        raise OSError("disk gone")

    monkeypatch.setattr(files, "fsync", broken)
    with pytest.raises(OSError, match="disk gone"):
        replace_bytes(dest, b"lost")
    assert dest.read_bytes() == b"kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]
