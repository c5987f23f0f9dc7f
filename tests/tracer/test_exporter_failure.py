"""The traced reference server keeps serving while an exporter fails: its trace directory
becomes unusable, its ``export`` raises, or its ``export`` hangs. Requests (real HTTP,
streamed) before and during the failure all succeed at normal TTFT, a healthy exporter
beside the failing one still gets every span, the failing one's losses are counted exactly
(in ``tt.stats()``, ``/metrics`` and the shutdown summary), and shutdown returns within its
timeout.

Latency bound: the median TTFT during the failure must stay below 3x the median measured
before it in the same test, plus 50 ms. Generous on purpose: the tiny model's TTFT is a few
ms and this runs on a shared 2-core box where a failing exporter's thread (writing Parquet,
formatting tracebacks) competes with the server for the CPU and the GIL; a tracer that made
requests wait for an exporter would blow through it (the hang lasts the whole test).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import threading
import time

import httpx
import pytest
from _live import Collect
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client.parser import text_string_to_metric_families

import ttft.tracer as tt
from ttft.collectors import read_spans
from ttft.collectors.otel_exporter import ParquetSpanExporter
from ttft.engine.server import build_engine, serving

MODEL = "tiny"
TIMEOUT_S = 20.0
SHUTDOWN_TIMEOUT_S = 1.0
HANG_S = 600.0  # far longer than any run of this test; released when the test ends
SIZES = [
    pytest.param(8, 25, id="short"),
    pytest.param(100, 1500, id="full", marks=pytest.mark.stress),
]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    engine = build_engine("tiny", device="cpu", seed=0, measure_peaks=False,
                          tokenizer_cache_dir=str(tmp_path_factory.mktemp("tokenizer")))
    with serving(engine, model_name=MODEL) as base_url:
        yield base_url


class Good(Collect):
    """A healthy exporter next to the failing one; remembers that it was shut down."""

    def __init__(self) -> None:
        super().__init__()
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


class Raises(SpanExporter):
    """Exports fine until ``failing`` is set; from then on every ``export`` raises."""

    def __init__(self) -> None:
        self.failing = threading.Event()

    def export(self, spans):
        if self.failing.is_set():
            raise RuntimeError("backend down")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


class Hangs(SpanExporter):
    """Exports fine until ``failing`` is set; from then on ``export`` blocks for ``HANG_S``
    (until ``release`` is set at the end of the test)."""

    def __init__(self) -> None:
        self.failing = threading.Event()
        self.release = threading.Event()

    def export(self, spans):
        if self.failing.is_set():
            self.release.wait(HANG_S)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


def send(client: httpx.Client, url: str) -> tuple[float, str]:
    """One streamed completion: (seconds to the first chunk with text, response id).
    Fails unless the response is 200 and the stream ends with ``[DONE]``."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "stream": True,
            "temperature": 0}
    started = time.perf_counter()
    first_s = response_id = None
    done = False
    with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line.removeprefix("data: "))
            response_id = chunk["id"]
            if first_s is None and chunk["choices"] and chunk["choices"][0]["text"]:
                first_s = time.perf_counter() - started
    assert done and first_s is not None and response_id is not None
    return first_s, response_id


def metrics(client: httpx.Client, url: str) -> dict[str, float]:
    text = client.get(f"{url}/metrics").text
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if set(s.labels) == {"model_name"}}


@pytest.fixture
def traced():
    """``traced(exporters, capacity)`` configures tracing; shut down after the test if the
    test did not (a failed test must not leave its recorder to the next one)."""

    def configure(exporters, capacity):
        return tt.configure("ttft-server", exporters, flush_interval_s=0.02, capacity=capacity)

    yield configure
    if tt.stats() is not None:
        tt.configure("ttft-server").shutdown(SHUTDOWN_TIMEOUT_S)


def served(good, response_ids) -> bool:
    """Whether the healthy exporter holds the ``server`` span of every response."""
    seen = {s.attributes.get("ttft.request_id") for s in good.spans if s.name == "server"}
    return seen >= set(response_ids)


def settle(tracing, good, response_ids, *, flush: bool) -> None:
    """Wait until the spans of the requests so far reached the healthy exporter: the server
    records a request's ``server`` span when its handler returns, which can be after the
    client saw the end of the stream (even after its next request), and then until nothing
    more arrives. ``flush``: through ``tracing.flush`` and until nothing is pending (not
    while an exporter hangs: each flush would wait for it until its timeout)."""
    deadline_s = time.monotonic() + TIMEOUT_S
    last = None
    while time.monotonic() < deadline_s:
        now = (tracing.flush(TIMEOUT_S), len(good.spans)) if flush else len(good.spans)
        if served(good, response_ids) and now == last and (not flush or now[0].pending == 0):
            return
        last = now
        time.sleep(0.1)
    raise AssertionError(f"spans still arriving after {TIMEOUT_S} s: {last}")


def serve_through_failure(url, tracing, good, start_failure, n_base, n_fail):
    """Send ``n_base`` requests, let their spans settle, start the failure, send ``n_fail``
    more and settle again; returns (baseline TTFTs, TTFTs during the failure, response
    ids, /metrics read during the failure)."""
    with httpx.Client(timeout=TIMEOUT_S) as client:
        warm_up = send(client, url)  # the first request pays one-off costs
        base = [send(client, url) for _ in range(n_base)]
        settle(tracing, good, [warm_up[1]] + [rid for _, rid in base], flush=True)
        before = tracing.recorder.result()
        assert (before.dropped, before.failed, before.pending) == (0, 0, 0)
        start_failure()
        during = [send(client, url) for _ in range(n_fail)]
        scraped = metrics(client, url)
    rids = [rid for _, rid in base + during]
    settle(tracing, good, rids, flush=False)  # before shutdown, which drops later spans
    return [s for s, _ in base], [s for s, _ in during], rids, scraped


def check_serving(base_s, during_s, good, response_ids):
    """Normal latency during the failure; the healthy exporter got every request's spans."""
    assert statistics.median(during_s) < 3 * statistics.median(base_s) + 0.050, (
        statistics.median(base_s), statistics.median(during_s))
    names: dict[str, set[str]] = {}
    for span in good.spans:
        names.setdefault(span.attributes.get("ttft.request_id"), set()).add(span.name)
    for rid in response_ids:
        assert {"server", "tokenize", "queue", "first_sampled", "first_byte"} <= names[rid]


def check_counts(per_exporter, result, good, scraped):
    """Exact accounting: the healthy exporter exported every span handed out, the failing
    one accounts for each of them, the queue dropped nothing, and ``/metrics`` showed the
    recorder's drops (no more than it ended with)."""
    bad_counts, good_counts = per_exporter
    handed = len(good.spans)
    assert good_counts == tt.FlushResult(handed, 0, 0, 0)
    assert good.shut_down
    assert sum(dataclasses.astuple(bad_counts)) == handed
    assert result.exported == handed + bad_counts.exported
    assert result.dropped == bad_counts.dropped  # nothing dropped from the queue itself
    assert (result.failed, result.pending) == (bad_counts.failed, bad_counts.pending)
    assert scraped["ttft:tracer_dropped_spans"] <= result.dropped
    assert scraped["ttft:tracer_failed_spans"] <= result.failed
    assert (scraped["ttft:tracer_failed_spans"] > 0) == (result.failed > 0)
    return bad_counts


def shutdown_summary(caplog, result) -> logging.LogRecord:
    """The recorder's one shutdown line, whose numbers are the result's."""
    lines = [r for r in caplog.records
             if r.name == "ttft.tracer.recorder" and r.getMessage().startswith(
                 "ttft recorder shutdown:")]
    assert len(lines) == 1
    message = lines[0].getMessage()
    assert f": {result.exported} spans exported, {result.dropped} dropped " in message
    assert f", {result.failed} failed to export, {result.pending} pending" in message
    return lines[0]


@pytest.mark.parametrize("n_base,n_fail", SIZES)
def test_an_unusable_trace_directory_costs_only_its_spans(url, traced, tmp_path, caplog,
                                                          n_base, n_fail):
    caplog.set_level(logging.INFO)
    bad = ParquetSpanExporter(tmp_path / "server.parquet", flush_spans=64,
                              flush_interval_s=0.2)
    good = Good()
    writer = bad.writer
    moved = tmp_path / "moved.parts"
    handed_before = []

    def break_directory() -> None:
        # chmod 0o500 stops nobody when tests run as root (they do here), so take the
        # directory away instead: the parts written so far move aside and a regular file
        # takes its name, so every later part write fails with NotADirectoryError.
        handed_before.append(len(good.spans))
        os.rename(writer.parts_dir, moved)
        writer.parts_dir.write_text("not a directory any more")

    tracing = traced([bad, good], capacity=4096)
    base_s, during_s, rids, scraped = serve_through_failure(
        url, tracing, good, break_directory, n_base, n_fail)
    started = time.perf_counter()
    result = tracing.shutdown(SHUTDOWN_TIMEOUT_S)
    assert time.perf_counter() - started < SHUTDOWN_TIMEOUT_S + 0.5
    check_serving(base_s, during_s, good, rids)
    counts = check_counts(tracing.recorder.by_exporter(), result, good, scraped)

    assert counts.failed > 0 and (counts.dropped, counts.pending) == (0, 0)
    assert counts.failed == bad.dropped_spans  # batches whose flush failed
    # every span handed to the writer is in a part it wrote, or counted lost (one row each):
    # everything up to the break (flushed just before it), nothing after it
    assert writer.rows_written + writer.dropped_rows == len(good.spans)
    assert read_spans(moved).num_rows == writer.rows_written == handed_before[0]
    assert writer.dropped_rows >= counts.failed
    assert f"{writer.dropped_rows} span rows lost to failed writes" in caplog.text
    assert shutdown_summary(caplog, result).levelno == logging.WARNING
    assert scraped["ttft:tracer_dropped_spans"] == 0


@pytest.mark.parametrize("n_base,n_fail", SIZES)
def test_an_exporter_that_raises_costs_only_its_spans(url, traced, caplog, n_base, n_fail):
    caplog.set_level(logging.INFO)
    bad, good = Raises(), Good()
    tracing = traced([bad, good], capacity=4096)
    base_s, during_s, rids, scraped = serve_through_failure(
        url, tracing, good, bad.failing.set, n_base, n_fail)
    started = time.perf_counter()
    result = tracing.shutdown(SHUTDOWN_TIMEOUT_S)
    assert time.perf_counter() - started < SHUTDOWN_TIMEOUT_S + 0.5
    check_serving(base_s, during_s, good, rids)
    counts = check_counts(tracing.recorder.by_exporter(), result, good, scraped)

    assert counts.exported > 0 and counts.failed > 0 and (counts.dropped, counts.pending) == (0, 0)
    assert "Raises.export raised" in caplog.text and "backend down" in caplog.text
    assert shutdown_summary(caplog, result).levelno == logging.WARNING
    assert scraped["ttft:tracer_dropped_spans"] == 0


@pytest.mark.parametrize("n_base,n_fail", SIZES)
def test_an_exporter_that_hangs_costs_only_its_spans(url, traced, caplog, n_base, n_fail):
    caplog.set_level(logging.INFO)
    bad, good = Hangs(), Good()
    try:
        # a small backlog, so the hung exporter's overflow shows up within the short run
        tracing = traced([bad, good], capacity=256)
        base_s, during_s, rids, scraped = serve_through_failure(
            url, tracing, good, bad.failing.set, n_base, n_fail)
        started = time.perf_counter()
        result = tracing.shutdown(SHUTDOWN_TIMEOUT_S)
        took_s = time.perf_counter() - started
        per_exporter = tracing.recorder.by_exporter()  # before the release changes them
    finally:
        bad.release.set()
    assert took_s < SHUTDOWN_TIMEOUT_S + 0.5  # left behind at the timeout, not waited for
    check_serving(base_s, during_s, good, rids)
    counts = check_counts(per_exporter, result, good, scraped)

    # its backlog filled up (dropping the rest) behind the export that never returned
    assert counts.dropped > 0 and 0 < counts.pending <= 256
    assert scraped["ttft:tracer_dropped_spans"] > 0
    summary = shutdown_summary(caplog, result)
    assert summary.levelno == logging.WARNING
    assert "(Hangs did not finish in time)" in summary.getMessage()
