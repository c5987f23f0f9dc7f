"""Strings from paths, files and the network are printed as plain text: rich markup in a
trace's path, span, service and clock names, errors, metadata or a server's answers is
shown as written, escape sequences are shown escaped (``\\x1b``), and no command fails on
them. Through the real CLI (typer's CliRunner, one subprocess for the terminal's bytes)
and a small Starlette server over loopback for ``ttft trace``."""

from __future__ import annotations

import io
import json
import os
import subprocess

import pyarrow as pa
import pytest
from _build import row
from _live import running
from hypothesis import given
from hypothesis import strategies as st
from rich.table import Table
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from test_cli import ttft_script
from typer.testing import CliRunner

from ttft.collectors import write_trace
from ttft.collectors.synthetic import generate
from ttft.reports._text import PlainConsole, labelled, plain, safe
from ttft.reports.cli import _app, app

runner = CliRunner()

HOSTILE = "[/]a[bold red]b[link=http://x]c\x1b[31md\x1b[0m"
SHOWN = "[/]a[bold red]b[link=http://x]c\\x1b[31md\\x1b[0m"  # what the terminal must show
OFFSET_NS = 80_000_000  # the server clock's offset: makes ttft print the clock pair


def hostile_path(root) -> tuple[os.PathLike, str]:
    """A trace path with ``[/]``, ``[bold red]``, ``[link=...]`` and an ESC sequence in it,
    and the path as it must be shown."""
    folder = root / "a[" / "]b[bold red]c[link=http:"
    folder.mkdir(parents=True)
    path = folder / "x]y\x1b[31mz.parquet"
    return path, str(path).replace("\x1b", "\\x1b")


def write_hostile_trace(path) -> None:
    """A synthetic trace whose server clock, services, two client errors, one extra span's
    name, the metadata and the device's name carry :data:`HOSTILE`."""
    synthetic = generate(40, seed=1)
    rows = synthetic.table.to_pylist()
    failed = 0
    for r in rows:
        if r["clock"].startswith("host:"):
            r["clock"] = "host:" + HOSTILE
            r["start_ns"] += OFFSET_NS
            r["end_ns"] += OFFSET_NS
        r["service"] += HOSTILE
        if r["stage"] == "client" and failed < 2:
            attributes = json.loads(r["attributes"])
            attributes.update(outcome="disconnected", error="boom " + HOSTILE, status_code=200)
            r["attributes"] = json.dumps(attributes)
            failed += 1
    first = rows[0]
    rows.append(row(1, 0xFF01, "span " + HOSTILE, first["start_ns"], first["end_ns"],
                    stage="other", service="engine" + HOSTILE))
    rows[-1]["trace_id"] = first["trace_id"]
    metadata = {**synthetic.metadata, "note": "meta " + HOSTILE,
                "device": {"type": "cuda", "name": "gpu " + HOSTILE}}
    write_trace(path, pa.Table.from_pylist(rows, schema=synthetic.table.schema), metadata)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    path, shown = hostile_path(tmp_path_factory.mktemp("plain"))
    write_hostile_trace(path)
    return path, shown


def ok(result, code: int = 0) -> str:
    """The output of a finished command: the exit code expected, no traceback, no raw ESC."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output and "MarkupError" not in result.output
    assert "\x1b" not in result.output
    return result.output


CLOCK_LINE = f"clocks: host:{SHOWN} → client offset {-OFFSET_NS / 1e6:+,.3f} ms"


@pytest.mark.parametrize(("command", "expected"), [
    (["analyze"], ["ttft analyze {path}  boundary=client", f"HTTP 200: boom {SHOWN}", CLOCK_LINE]),
    (["analyze", "--regime"], ["ttft analyze {path}", f"no peaks for device 'gpu {SHOWN}': "]),
    (["report"], ["ttft report {path}", f"HTTP 200: boom {SHOWN}", f"meta {SHOWN}", CLOCK_LINE]),
])
def test_analyze_and_report_print_paths_names_and_errors_as_written(hostile, command, expected):
    path, shown = hostile
    out = ok(runner.invoke(app, [command[0], str(path), *command[1:]]))
    for text in expected:
        assert text.replace("{path}", shown) in out


def test_compare_prints_both_paths_as_written(hostile):
    path, shown = hostile
    out = ok(runner.invoke(app, ["compare", str(path), str(path), "--resamples", "50"]))
    assert f"ttft compare A {shown} B {shown} boundary=" in " ".join(out.split())  # wrapped


def test_export_and_import_print_their_paths_as_written(hostile, tmp_path):
    path, shown = hostile
    target, target_shown = hostile_path(tmp_path)
    perfetto = target.with_suffix(".json")
    out = ok(runner.invoke(app, ["export", str(path), "--perfetto", str(perfetto)]))
    assert f"wrote {target_shown[: -len('.parquet')]}.json: " in out
    out = ok(runner.invoke(app, ["import", str(perfetto), "-o", str(target)]))
    assert f"read {target_shown[: -len('.parquet')]}.json (chrome): " in out
    assert f"wrote {target_shown} in " in out
    out = ok(runner.invoke(app, ["import", str(path), "-o", str(target)]))
    assert f"read {shown} (ttft): " in out


def test_a_missing_file_is_one_error_line_as_written(tmp_path):
    missing = tmp_path / "nope[/]x[bold red]y\x1b[31m.parquet"
    shown = str(missing).replace("\x1b", "\\x1b")
    for command in (["analyze"], ["analyze", "--regime"], ["report"], ["export"]):
        argv = [command[0], str(missing), *command[1:]]
        if command == ["export"]:
            argv += ["--perfetto", str(tmp_path / "o.json")]
        out = ok(runner.invoke(app, argv), code=2)
        assert out.strip() == f"error: {shown}: does not exist"


def test_the_terminal_gets_no_escape_byte_from_a_trace(hostile):
    path, shown = hostile
    done = subprocess.run([ttft_script(), "analyze", str(path)], capture_output=True,
                          timeout=120, check=False, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"\x1b" not in done.stdout and b"\x1b" not in done.stderr
    assert f"ttft analyze {shown}".encode() in done.stdout
    assert f"clocks: host:{SHOWN}".encode() in done.stdout


def test_the_spinner_shows_a_path_as_written(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(_app, "err", PlainConsole(file=buf, force_terminal=True, width=200))
    with _app.progress(f"reading {HOSTILE}"):
        pass
    assert "\x1b[31md" not in buf.getvalue()


async def _models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": "m " + HOSTILE, "object": "model"}]})


async def _unauthorized(request: Request) -> Response:
    return Response("no " + HOSTILE, status_code=401, media_type="text/plain")


async def _refused(request: Request) -> Response:
    return Response("refused " + HOSTILE, status_code=400, media_type="text/plain")


def _trace(url: str, out) -> str:
    return runner.invoke(app, [
        "trace", url, "--concurrency", "2", "--requests", "3", "--prompt-tokens", "12:20",
        "--output-tokens", "3", "--receiver-port", "0", "--span-wait", "0", "-o", str(out),
    ])


def test_trace_prints_a_servers_error_body_as_written(tmp_path):
    app_ = Starlette(routes=[Route("/v1/models", _unauthorized)])
    with running(app_) as url:
        out = ok(_trace(url, tmp_path / "run.parquet"), code=2)
    assert out.strip() == (f"error: {url}/v1/models: HTTP 401 (no {SHOWN}): no model to ask "
                           "for; pass --model")


def test_trace_prints_a_model_name_and_failures_as_written(tmp_path):
    app_ = Starlette(routes=[Route("/v1/models", _models),
                             Route("/v1/completions", _refused, methods=["POST"])])
    with running(app_) as url:
        out = ok(_trace(url, tmp_path / "run.parquet"))
    assert f"HTTP 400: refused {SHOWN}" in out
    assert "3 requests (3 failed)" in out


@given(st.text())
def test_any_text_prints_as_its_escaped_self(text):
    console = PlainConsole(file=io.StringIO(), width=10_000, color_system=None)
    console.print(plain(text), soft_wrap=True, end="")
    console.print(text, soft_wrap=True, end="")
    table = Table(title=text)
    table.add_column(text)
    table.add_row(text, plain(text))
    console.print(table)
    written = console.file.getvalue()
    assert written.startswith(safe(text) + safe(text, keep_newlines=True))
    assert not any(ch in written for ch in "\x1b\x07\x08\x7f\x9b\r")


def test_safe_escapes_controls_and_keeps_brackets():
    assert safe("[/]\x1b[31m\t\n\x00\x7f\x9b\u202e") == "[/]\\x1b[31m\\t\\n\\x00\\x7f\\x9b\\u202e"
    assert safe("a\nb", keep_newlines=True) == "a\nb"
    assert labelled("error:", "bold red", "[/]x").plain == "error: [/]x"
