"""Every terminal table fits the console's width, numbers whole, stack legend in letters."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from rich.cells import cell_len
from rich.table import Table

from ttft.analysis import analyze
from ttft.collectors.synthetic import generate
from ttft.reports._text import PlainConsole
from ttft.reports.report_data import build_report
from ttft.reports.runs.validate import StageCheck
from ttft.reports.terminal import fit, render_analysis
from ttft.reports.terminal_report import LETTERS, render_report
from ttft.reports.validate_view import render_validate

NUMBER = re.compile(r"-?\d[\d,]*\.\d+")


@pytest.fixture(scope="module")
def analysis():
    return analyze(generate(300, seed=1).table, trace="synth")


def _render(render, width: int) -> str:
    console = PlainConsole(width=width, file=io.StringIO(), force_terminal=False)
    render(console)
    return console.file.getvalue()


def _check_width(text: str, width: int) -> None:
    for line in text.splitlines():
        assert cell_len(line) <= width, line


@pytest.mark.parametrize("width", [80, 100, 140])
def test_analyze_fits(analysis, width):
    text = _render(lambda c: render_analysis(analysis.summary, c), width)
    _check_width(text, width)
    assert "…" not in text


def test_analyze_keeps_p50_p99_mean_at_80(analysis):
    narrow = _render(lambda c: render_analysis(analysis.summary, c), 80)
    for row in analysis.summary.stages.values():
        for key in ("p50", "p99", "mean"):
            assert f"{row[key]:,.2f}" in narrow
    wide = set(NUMBER.findall(_render(lambda c: render_analysis(analysis.summary, c), 140)))
    assert set(NUMBER.findall(narrow)) <= wide


@pytest.mark.parametrize("width", [80, 100, 140])
def test_report_fits_and_legend_has_letters(analysis, width):
    data = build_report(analysis)
    text = _render(lambda c: render_report(data, c), width)
    _check_width(text, width)
    assert "…" not in text
    legend = {f"{LETTERS[s]} {s}" for s in ("gpu", "queue", "prefill")}
    assert all(entry in text for entry in legend)
    assert "█" not in text.split("where TTFT goes")[1].split("TTFT distribution")[0]


def test_cli_at_80_columns(tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    for path, seed in ((a, 1), (b, 2)):
        subprocess.run(["ttft", "synth", "-o", str(path), "--requests", "300",
                        "--seed", str(seed)], check=True, capture_output=True)
    env = {**os.environ, "COLUMNS": "80"}
    commands = (["analyze", str(a), "--slo", "ttft=300ms"], ["report", str(a)],
                ["compare", str(a), str(b)])
    for args in commands:
        out = subprocess.run([sys.executable, "-m", "ttft.reports.cli", *args], env=env,
                             check=True, capture_output=True, text=True).stdout
        _check_width(out, 80)
        assert out.count("└") >= 1


@pytest.mark.parametrize("width", [80, 100, 140])
def test_validate_table_fits(width):
    checks = [StageCheck(stage, 1.25, 1021.5, 1000.0, 50.0) for stage in LETTERS]
    result = SimpleNamespace(stages=checks, ttft=StageCheck("ttft", 80.0, 1180.5, 1100.0, 55.0),
                             injected=SimpleNamespace(windows=1_000))
    text = _render(lambda c: c.print(render_validate(result)), width)
    _check_width(text, width)
    assert "…" not in text and "1,021.50" not in text and "1021.50" in text
    assert text.count("±50.00") == len(LETTERS)


def test_no_colour_bars_still_tell_stages(analysis):
    data = build_report(analysis)
    console = PlainConsole(width=80, file=io.StringIO(), no_color=True)
    render_report(data, console)
    bands = console.file.getvalue().split("where TTFT goes")[1].split("each bar sums")[0]
    bars = [line.split("│")[4].strip() for line in bands.splitlines() if line.count("│") > 4]
    assert bars and all(set(bar) <= set(LETTERS.values()) for bar in bars if bar)
    assert any(len(set(bar)) > 1 for bar in bars)


def test_fit_takes_a_table_without_rows():
    console = PlainConsole(width=80, file=io.StringIO(), force_terminal=False)
    table = Table()
    table.add_column("stage")
    table.add_column("p50 ms", justify="right")
    console.print(fit(table, console, ("p50 ms",)))
    assert "stage" in console.file.getvalue()


def test_failure_lines_wrap_to_the_width_and_keep_every_character(analysis):
    import dataclasses

    from ttft.reports.terminal import render_failures

    error = "HTTP 500: " + "upstream engine worker exited while the request was queued; " * 4
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    summary = dataclasses.replace(
        analysis.summary,
        failures={"server_error": 3},
        failure_examples={"server_error": [{"trace_id": trace_id, "status_code": 500,
                                             "error": error.strip()}]},
    )
    text = _render(lambda c: render_failures(summary, c), 80)
    _check_width(text, 80)
    joined = "".join(line.strip() for line in text.splitlines())
    assert f"server_error: {trace_id}: {error.strip()}".replace(" ", "") in joined.replace(" ", "")
