"""One story: the live progress line of a traced run, the summary `ttft trace` prints and
`ttft analyze` of the written file agree on the requests and their TTFT percentiles."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from ttft.collectors import TraceSpec, trace_server
from ttft.engine.server import build_engine, free_port, serving
from ttft.reports.cli import app
from ttft.reports.cli._progress import RunDisplay


def test_progress_line_and_analysis_agree(tmp_path):
    out = tmp_path / "run.parquet"
    display = RunDisplay(Console(file=io.StringIO(), width=200))
    with serving(build_engine("tiny", device="cpu"), model_name="tiny") as url, display:
        spec = TraceSpec(url=url, rate=40.0, requests=16, prompt_tokens=(8, 40),
                         output_tokens=4, seed=5, receiver_port=free_port(), span_wait_s=0.2)
        run = trace_server(spec, out, **display.callbacks())
    analyzed = json.loads(CliRunner().invoke(app, ["analyze", str(out), "--json"]).stdout)
    assert display.sent == len(run.results) == 16
    assert display.errors == run.errors == sum(analyzed["failures"].values())
    assert len(display.ttfts) == analyzed["requests_ok"] == 16 - run.errors
    p50, p99 = display.ttft_ms()
    # the same requests and the same percentile rule; the line keeps float ms, the trace ns
    assert p50 == pytest.approx(analyzed["ttft_ms"]["p50"], abs=1e-3)
    assert p99 == pytest.approx(analyzed["ttft_ms"]["p99"], abs=1e-3)
    assert f"p50 {analyzed['ttft_ms']['p50']:,.1f} ms" in display.stats()
