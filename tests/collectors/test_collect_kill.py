"""`ttft collect` under SIGKILL (issue 16, item 4): a real process on loopback takes spans
from four concurrent senders (three OTLP/HTTP, one OTLP/gRPC) and is killed at three
moments: after its first few acknowledged requests, in the middle of the load, and just
after its writer wrote a part. Every span it acknowledged must be in what
``read_spans(DIR)`` reads back, and ``ttft analyze DIR`` must read the killed run and say
so; during a run, it reads a finished and a live run of one directory together.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from _collect import CollectProcess as Collect
from _kill_senders import TIMEOUT_S, Load, export_request, http_exporter

from ttft.collectors import read_inputs, read_spans

EARLY_REQUESTS = 5
MID_LOAD_S = 1.5
PART_WAIT_S = 15.0
"""Longest wait for the writer's first part (it writes one per 50,000 rows or 5 s)."""


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline_s, f"no {what} within {timeout_s} s"
        time.sleep(0.01)


def _part_written(out: Path) -> bool:
    return any(out.glob("*.parts/part-*.parquet"))


def _analyze(out: Path) -> tuple[str, dict]:
    """``ttft analyze out --json``: the line it printed about what it read, and its JSON."""
    result = subprocess.run([sys.executable, "-m", "ttft.reports.cli", "analyze", str(out),
                             "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith(f"read {out}:")]
    return line, json.loads(result.stdout)


def _kill_when(moment: str, collect: Collect, load: Load, out: Path) -> None:
    """SIGKILL at ``moment``: ``early``, ``after-part``, or after ``load-<seconds>``."""
    if moment == "early":
        _wait_for(lambda: load.requests >= EARLY_REQUESTS
                  and all(sender.requests for sender in load.senders),
                  TIMEOUT_S, "acknowledged requests from every sender")
    elif moment == "after-part":
        _wait_for(lambda: _part_written(out), PART_WAIT_S, "part file")
    else:
        _wait_for(lambda: load.requests >= 1, TIMEOUT_S, "acknowledged request")
        time.sleep(float(moment.removeprefix("load-")))
    collect.process.send_signal(signal.SIGKILL)


@pytest.mark.parametrize("moment", ["early", f"load-{MID_LOAD_S}", "after-part"])
def test_a_kill_loses_no_acknowledged_span(tmp_path, moment):
    _kill_under_load_and_check(tmp_path / "spans", moment)


@pytest.mark.stress
@pytest.mark.parametrize("moment", ["load-7.5", "load-12.0", "load-20.0"])
def test_a_kill_after_long_load_loses_no_acknowledged_span(tmp_path, moment):
    """The full-size runs: kills after several parts, timed and by size."""
    _kill_under_load_and_check(tmp_path / "spans", moment)


def _kill_under_load_and_check(out: Path, moment: str) -> None:
    collect = Collect(out)
    load = None
    try:
        load = Load(collect.http_url, collect.grpc_url).start()
        _kill_when(moment, collect, load, out)
        collect.kill()
    finally:
        if load is not None:
            load.end()
        collect.kill()
    assert load.unexpected() == []
    assert all(sender.requests for sender in load.senders), [
        (sender.name, sender.requests) for sender in load.senders]
    acknowledged, sent = load.acknowledged, load.sent
    table = read_spans(out)
    stored = Counter(table.column("span_id").to_pylist())
    lost = acknowledged - stored.keys()
    assert len(lost) == 0, (f"{moment}: {len(lost)} of {len(acknowledged)} acknowledged spans "
                            f"lost ({len(stored)} stored, {len(sent)} sent), e.g. "
                            f"{sorted(lost)[:3]}")
    assert stored.keys() <= sent
    assert [span for span, n in stored.items() if n > 1] == []  # each was sent once
    (run,) = read_inputs(table)
    assert (run["state"], run["spans"]) == ("unfinished", table.num_rows)
    if moment == "after-part":
        assert run["parts"] >= 1
    print(f"{moment}: {len(acknowledged)} acknowledged in {load.requests} requests, "
          f"{table.num_rows} stored, {len(sent)} sent")

    line, report = _analyze(out)
    assert line.startswith(f"read {out}: 1 run, {table.num_rows:,} spans: "), line
    assert "unfinished" in line, line
    assert [(i["state"], i["spans"]) for i in report["inputs"]] == [
        ("unfinished", table.num_rows)]


def test_analyze_reads_a_finished_and_a_live_run_of_one_directory(tmp_path):
    out = tmp_path / "spans"
    first = Collect(out)
    try:
        export, close = http_exporter(first.http_url)
        export(export_request(0, 0, 100).SerializeToString())
        close()
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(TIMEOUT_S) == 0
    finally:
        first.kill()
    live = Collect(out)
    load = None
    try:
        load = Load(live.http_url, live.grpc_url, n_http=1, n_grpc=1).start()
        _wait_for(lambda: load.requests >= 4, TIMEOUT_S, "acknowledged requests")
        acknowledged = len(load.acknowledged)  # before the read: it must see all of these
        line, report = _analyze(out)  # while the senders still send
        assert live.process.poll() is None
    finally:
        if load is not None:
            load.end()
        live.kill()
    assert load.unexpected() == []
    assert line.startswith(f"read {out}: 2 runs, "), line
    states = {Path(i["path"]).name: (i["state"], i["spans"]) for i in report["inputs"]}
    assert states[first.trace.name] == ("finished", 100), states
    state, spans = states[live.trace.name + ".parts"]
    assert state == "unfinished" and spans >= acknowledged >= 4 * 100, states
    assert f"{first.trace.name} (finished, 100 spans)" in line, line
    assert f"{live.trace.name}.parts (unfinished" in line, line
