"""Every terminal table fits the console's width, numbers whole, stack legend in letters;
at 80 columns the notes under a stage table explain the columns shown and name the ones
and the rows left out; the live progress display of a traced run fits 80 columns of a real
terminal with nothing cut."""

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
from ttft.reports.views.validate import render_validate

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


def _notes(text: str) -> str:
    """The lines under the last stage table up to the next table, joined with spaces."""
    after = text.split("└")[-1] if "tail:" not in text else text.split("tail:")[0]
    return " ".join(after.split())


def _rows(text: str) -> set[str]:
    return {line.split("│")[1].strip() for line in text.splitlines() if line.count("│") > 2}


def test_analyze_at_80_explains_only_the_columns_it_shows(analysis):
    narrow = _render(lambda c: render_analysis(analysis.summary, c), 80)
    wide = _render(lambda c: render_analysis(analysis.summary, c), 140)
    headers = narrow.split("┡")[0]
    assert "raw mean" not in headers and "overlap" not in headers
    assert all(h in headers for h in ("p50 ms", "p90 ms", "p99 ms", "mean ms"))
    notes = _notes(narrow)
    assert "share: the stage's attributed time over all TTFT." in notes
    assert "raw:" not in notes and "overlap =" not in notes
    assert ("Left out at this width: raw mean ms, overlap ms (a wider terminal shows them, "
            "as does ttft analyze --json).") in notes
    wide_notes = _notes(wide)
    assert "raw mean ms" in wide.split("┡")[0] and "Left out" not in wide_notes
    assert ("raw: its spans' durations clipped to the window; overlap = raw - attributed, "
            "the double counting that adding durations would do.") in wide_notes


def test_zero_rows_are_named_with_why_and_kept_in_json(analysis):
    summary = analysis.summary
    assert summary.stages["client"]["mean"] == 0 < summary.stages["client"]["raw_mean"]
    text = _render(lambda c: render_analysis(summary, c), 80)
    tables = text.split("tail:")[0]
    assert "client" not in _rows(tables)
    assert {"gpu", "queue", "prefill", "connect"} <= _rows(tables)
    notes = _notes(text)
    assert ("not shown, 0 ms in every request: client (the window's root: its time is its "
            "inner spans' and, where none runs, network") in notes
    # a p50 of 0 under a larger mean is explained once, for the stages it is true of
    median_zero = [s for s, r in summary.stages.items() if r["p50"] == 0 < r["mean"]]
    assert median_zero == ["connect", "prefill"]
    assert ("p50 0.00 under a larger mean (connect, prefill): at least half the requests "
            "have none of that stage's time") in notes
    assert notes.count("p50 0.00 under") == 1
    assert "client" in summary.to_dict()["stages"]  # --json keeps every row


def test_a_stage_zero_in_one_condition_is_named_with_it():
    stages = {"gpu": {"p50": 5.0, "p90": 6.0, "p99": 7.0, "mean": 5.0, "share": 1.0,
                      "raw_mean": 5.0, "overlap_mean": 0.0},
              "prefill": {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0, "share": 0.0,
                          "raw_mean": 5.0, "overlap_mean": 5.0}}
    from ttft.reports.views.stage import StageBlock

    def draw(console):
        block = StageBlock(console, "engine", "exclusive")
        block.add("prefix_hit: 3 requests", {"p50": 5.0}, stages, scope="prefix_hit")
        console.print(block.render())

    text = _render(draw, 80)
    assert _rows(text) == {"gpu"}
    assert ("not shown, 0 ms in every request: prefill among prefix_hit (its spans' 5.00 ms "
            "raw mean is all covered by spans ranked above it).") in " ".join(text.split())


def test_report_at_80_keeps_raw_and_overlap(analysis):
    text = _render(lambda c: render_report(build_report(analysis), c), 80)
    part = text.split("raw durations against attributed time")[1].split("wait blame")[0]
    _check_width(part, 80)
    head = " ".join(part.split("┡")[0].split())
    assert all(word in head for word in ("raw", "overlap", "mean", "p50"))
    assert "p90" not in head and "p99" not in head
    notes = " ".join(part.split("└")[1].split())
    assert "raw: its spans' durations clipped to the window; overlap = raw - attributed" in notes
    assert "Left out at this width: p90 ms, p99 ms" in notes
    stages = analysis.summary.stages
    for stage in ("gpu", "prefill", "server"):
        line = next(r for r in part.splitlines() if r.startswith(f"│ {stage} "))
        assert f"{stages[stage]['raw_mean']:,.2f}" in line
        assert f"{stages[stage]['overlap_mean']:,.2f}" in line


_RUN = """
from types import SimpleNamespace
from ttft.reports.cli._app import err
from ttft.reports.cli._progress import RunDisplay
with RunDisplay(err) as display:
    display.start(1000, "http://127.0.0.1:4318/v1/traces")
    for i in range(1000):
        display.on_sent(i)
        ok = i % 9 != 0
        display.on_result(SimpleNamespace(outcome="ok" if ok else "error",
                                          ttft_s=1.2345 * (i % 7 + 1)))
    display.waiting()
"""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _last_frame(raw: str) -> list[str]:
    """The lines of the progress display as the terminal last drew them."""
    text = _ANSI.sub("", raw.replace("\r\n", "\n"))
    lines = [line.split("\r")[-1] for line in text.split("\n")]
    return [line.rstrip() for line in lines if line.strip()][-2:]


def _progress_in_a_pty(columns: int) -> list[str]:
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([sys.executable, "-c", _RUN], stdin=slave, stdout=slave,
                            stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")
    return _last_frame(b"".join(chunks).decode())


@pytest.mark.parametrize("columns", [80, 140])
def test_progress_fits_a_real_terminal(columns):
    bar_line, figures = _progress_in_a_pty(columns)
    assert bar_line.startswith("waiting for the server's spans ━")
    assert re.search(r"━ 1000/1000 \d:\d\d:\d\d$", bar_line), bar_line
    assert figures == "sent 1000  failed 112  ok TTFT p50 4,938.0 ms  p99 8,641.5 ms"
    for line in (bar_line, figures):
        assert cell_len(line) <= columns and "…" not in line
    bar = bar_line.count("━") + bar_line.count("╸")
    assert bar == (31 if columns == 80 else 40)  # narrowed to fit, 40 at most


def test_progress_at_80_columns_of_a_console():
    from ttft.reports.cli._progress import RunDisplay

    console = PlainConsole(width=80, file=io.StringIO(), force_terminal=True)
    with RunDisplay(console) as display:
        display.start(40, "http://127.0.0.1:4318/v1/traces")
        display.on_sent(0)
        display.on_result(SimpleNamespace(outcome="ok", ttft_s=0.25))
    bar_line, figures = _last_frame(console.file.getvalue())
    assert bar_line.startswith("requests ") and " 1/40 " in bar_line
    assert figures == "sent 1  failed 0  ok TTFT p50 250.0 ms  p99 250.0 ms"
    _check_width("\n".join((bar_line, figures)), 80)
