"""`ttft trace` takes the URL an openai client is given (``.../v1``), and a receiver port in
use is one line naming it, with nothing written at ``-o``."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from ttft.collectors import read_spans, run_metadata
from ttft.collectors.trace_run import server_root
from ttft.engine.server import build_engine, serving
from ttft.reports.cli import app

runner = CliRunner()
MODEL = "tiny"


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("tokenizer"))
    with serving(build_engine("tiny", device="cpu", tokenizer_cache_dir=cache),
                 model_name=MODEL) as url:
        yield url


def test_server_root_drops_one_trailing_v1_and_keeps_other_paths():
    assert [server_root(u) for u in (
        "http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/",
        "https://h/proxy/v1", "http://h:8000/v1x", "http://h:8000/v1/v1")] == [
        "http://h:8000", "http://h:8000", "http://h:8000", "http://h:8000",
        "https://h/proxy", "http://h:8000/v1x", "http://h:8000/v1"]


@pytest.mark.parametrize("suffix", ["/v1", "/v1/"])
def test_trace_accepts_the_openai_base_url(server_url, suffix, tmp_path):
    out = tmp_path / "run.parquet"
    result = runner.invoke(app, [
        "trace", server_url + suffix, "--burst", "2", "--prompt-tokens", "12",
        "--output-tokens", "2", "--receiver-port", "0", "--span-wait", "0.2", "-o", str(out),
    ])
    assert result.exit_code == 0, result.output
    assert "2 requests (0 failed)" in result.output
    assert run_metadata(read_spans(out))["server"]["url"] == server_url


def test_a_busy_receiver_port_is_named_and_leaves_no_file(server_url, tmp_path):
    out = tmp_path / "run.parquet"
    previous = tmp_path / "kept.parquet"
    previous.write_bytes(b"an earlier trace")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        results = [runner.invoke(app, [
            "trace", server_url, "--burst", "1", "--receiver-port", str(port), "-o", str(path),
        ]) for path in (out, previous)]
    for result in results:
        assert result.exit_code == 2
        assert result.stderr.strip() == (
            f"error: cannot listen for OTLP/HTTP on 127.0.0.1:{port}: Address already in use")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.parquet"]  # no parts dir
    assert previous.read_bytes() == b"an earlier trace"  # not replaced by an empty trace
