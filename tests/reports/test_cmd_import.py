"""``ttft import`` and reading other systems' files directly in analyze, report and export."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ttft.collectors import read_spans, run_metadata
from ttft.reports.cli import app

runner = CliRunner()
US = 1_700_000_000_000_000  # µs since the epoch


def _span(sid, name, start_us, dur_us, parent=None, logs=(), tags=()):
    return {
        "traceID": "ab" * 16,
        "spanID": sid,
        "operationName": name,
        "references": [{"refType": "CHILD_OF", "traceID": "ab" * 16, "spanID": parent}]
        if parent
        else [],
        "startTime": US + start_us,
        "duration": dur_us,
        "tags": list(tags),
        "logs": list(logs),
        "processID": "p1",
    }


@pytest.fixture
def jaeger(tmp_path):
    """One request as a serving stack would record it, in Jaeger's UI-download shape: the
    handler span ``http_request``, which only a user mapping knows is the server span."""
    spans = [
        _span("0000000000000001", "http_request", 0, 1000),
        _span("0000000000000002", "tokenize", 10, 50, "0000000000000001"),
        _span("0000000000000003", "queue", 60, 140, "0000000000000001"),
        _span("0000000000000004", "prefill", 200, 500, "0000000000000001"),
        _span("0000000000000005", "sample", 700, 50, "0000000000000001"),
        _span(
            "0000000000000006",
            "stream",
            750,
            50,
            "0000000000000001",
            logs=[
                {
                    "timestamp": US + 800,
                    "fields": [{"key": "event", "type": "string", "value": "first_byte"}],
                }
            ],
        ),
    ]
    doc = {
        "data": [
            {
                "traceID": "ab" * 16,
                "spans": spans,
                "processes": {"p1": {"serviceName": "router", "tags": []}},
            }
        ]
    }
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def mapping(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[[rule]]\nname = "http_request"\nservice = "rout*"\nstage = "server"\n')
    return path


def test_import_writes_a_ttft_trace_with_mapped_stages(jaeger, mapping, tmp_path):
    out = tmp_path / "out.parquet"
    result = runner.invoke(app, ["import", str(jaeger), "-o", str(out), "--mapping", str(mapping)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stderr.replace("\n", "")
    table = read_spans(out)
    stages = dict(
        zip(table.column("name").to_pylist(), table.column("stage").to_pylist(), strict=True)
    )
    assert stages == {
        "http_request": "server",
        "tokenize": "tokenize",
        "queue": "queue",
        "prefill": "prefill",
        "sample": "sample",
        "stream": "stream",
        "first_byte": "event",
    }
    assert run_metadata(read_spans(out))["source_format"] == "jaeger"


def test_analyze_reads_the_file_directly_with_the_same_rules(jaeger, mapping):
    result = runner.invoke(app, ["analyze", str(jaeger), "--mapping", str(mapping), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["boundary"] == "server"
    means = {stage: row["mean"] for stage, row in summary["stages"].items()}
    assert means == pytest.approx(
        {
            "server": 0.010,
            "tokenize": 0.050,
            "queue": 0.140,
            "prefill": 0.500,
            "sample": 0.050,
            "stream": 0.050,
        }
    )
    # Without the user rule the handler span is "other": no server window, engine boundary.
    result = runner.invoke(app, ["analyze", str(jaeger), "--json"])
    assert json.loads(result.stdout)["boundary"] == "engine"


def test_report_and_export_read_the_file_directly(jaeger, mapping, tmp_path):
    html = tmp_path / "r.html"
    result = runner.invoke(app, ["report", str(jaeger), "--mapping", str(mapping), "-o", str(html)])
    assert result.exit_code == 0, result.output
    assert "prefill" in html.read_text()
    out = tmp_path / "p.json"
    result = runner.invoke(
        app, ["export", str(jaeger), "--format", "jaeger", "--perfetto", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["traceEvents"]


def test_bad_inputs_give_one_error_naming_the_file(jaeger, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    for args, needle in (
        (["import", str(text), "-o", str(tmp_path / "x.parquet")], "not a trace format"),
        (["analyze", str(jaeger), "--format", "chrome"], str(jaeger)),
        (["analyze", str(jaeger), "--format", "nope"], "unknown format 'nope'"),
        (["analyze", str(jaeger), "--mapping", str(text)], str(text)),
        (["import", str(jaeger), "-o", str(jaeger)], "would overwrite the input"),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert needle in result.stderr.replace("\n", ""), (args, result.stderr)
    assert not (tmp_path / "x.parquet").exists()
