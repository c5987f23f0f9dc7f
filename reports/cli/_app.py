"""The ``ttft`` Typer application and what every command shares: the error line, the
spinner, the consoles and reading a trace with errors turned into that line.

Commands live in ``reports/cli/<command>.py``; each decorates its function with
``@app.command()`` and :mod:`ttft.reports.cli` imports them all, so adding a command never
means editing a shared file. Shared option declarations live in
:mod:`ttft.reports.cli._options`.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ttft.reports._text import PlainConsole, labelled, plain

if TYPE_CHECKING:
    import pyarrow as pa

    from ttft.analysis.pipeline import Analysis
    from ttft.analysis.summary import Summary

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="ttft: where did the time to first token go? Trace, attribute, report.",
    rich_markup_mode=None,
)
err = PlainConsole(stderr=True, highlight=False)


def fail(message: str) -> typer.Exit:
    """Print one error line and return the exit (code 2) to raise.

    ``message`` is printed as plain text (it quotes paths and servers' bodies): brackets as
    they are, control characters escaped."""
    err.print(labelled("error:", "bold red", message), soft_wrap=True)
    return typer.Exit(code=2)


def require_engine(command: str) -> None:
    """Return when PyTorch (the ``engine`` extra, which the reference engine runs on) can
    be imported.

    Raises:
        typer.Exit: code 2, after one line saying ``ttft COMMAND`` needs it and how to
            install it.
    """
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        raise fail(f"ttft {command} needs PyTorch, which is not installed: "
                   "pip install 'ttft[engine]'") from None


@contextmanager
def progress(message: str):
    """A spinner on stderr while ``message`` (plain text) runs (only on a terminal). It
    yields a function that replaces the message (a count as the work goes on); off a
    terminal it does nothing."""
    if err.is_terminal:
        with err.status(plain(message)) as status:
            yield lambda text: status.update(plain(text))
    else:
        yield lambda _text: None


def stdout_console() -> PlainConsole:
    """A console for results on stdout that prints every string as plain text: as wide as
    the terminal, or ``COLUMNS`` when set, else (piped) 140 columns. The renderers fit their
    tables to its ``width``."""
    import os
    import sys

    sized = sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit()
    return PlainConsole(highlight=False, width=None if sized else 140)


def load_trace(
    path: Path, *, format: str | None = None, mapping: Path | None = None,
    native: bool = False,
) -> tuple[pa.Table, dict[str, Any]]:
    """:func:`ttft.collectors.read_spans` for a command: the span table of ``path`` with
    stages mapped, and its run metadata; with ``native``, its ids as bytes where the file
    holds them so (what only the analysis reads: ``read_spans``' ``native``).

    Raises:
        typer.Exit: code 2 after printing what was wrong with the file or the mapping.
    """
    from ttft.collectors import TraceFileError, read_inputs, read_spans, run_metadata

    try:
        with progress(f"reading {path}"):
            table = read_spans(path, format=format, mapping=mapping, native=native)
    except (TraceFileError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.filename or path}: {exc.strerror or exc}") from None
    note_staged(path)
    inputs = read_inputs(table)
    if inputs is not None:
        err.print(plain(describe_inputs(path, inputs)), soft_wrap=True)
    from ttft.analysis.transfer import deployment_note

    metadata = run_metadata(table)
    note = deployment_note(metadata)  # disaggregated serving: where the first token came from
    if note is not None:
        err.print(plain(note), soft_wrap=True)
    return table, metadata


def note_staged(path: Path) -> None:
    """Say so when a dataset holds spans a collect staged and has not partitioned in yet
    (it was killed, or is still running): a reader of the dataset does not see them."""
    from ttft.collectors import TraceLocation, dataset_info

    location = TraceLocation(str(path))
    if runs := location.staged_runs():
        n = dataset_info(path)["partitions"]
        err.print(plain(f"{location.staging}: {_count(len(runs), 'run')} of spans a collect "
                        "staged and has not partitioned in (killed, or still running): not in "
                        f"this analysis; ttft collect -o {path} --partitions {n} partitions them "
                        "in"), soft_wrap=True)


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def describe_inputs(path: Path, inputs: list[dict[str, Any]]) -> str:
    """The line saying what a read of a directory or an unfinished run read, e.g. ``read
    DIR: 2 runs, 250 spans: a.parquet (finished, 50 spans); b.parquet.parts (unfinished:
    1 part, 1 log segment, 200 spans)``."""
    described = []
    for run in inputs:
        name = Path(run["path"]).name
        if run["state"] == "finished":
            described.append(f"{name} (finished, {_count(run['spans'], 'span')})")
            continue
        detail = [_count(run["parts"], "part"), _count(run["log_segments"], "log segment"),
                  _count(run["spans"], "span")]
        if run["torn_bytes"]:
            detail.append(f"an incomplete last log record of {run['torn_bytes']:,} bytes "
                          "left out (being written, or cut by a kill: never acknowledged)")
        described.append(f"{name} (unfinished, still being written or its writer was "
                         f"stopped: {', '.join(detail)})")
    total = sum(run["spans"] for run in inputs)
    return (f"read {path}: {_count(len(inputs), 'run')}, {_count(total, 'span')}: "
            + "; ".join(described))


def model_config_fields(path: Path | None) -> dict[str, Any] | None:
    """The model config fields in the JSON file ``path`` (None without one).

    Raises:
        typer.Exit: code 2 when it cannot be read or holds no JSON object.
    """
    import json

    if path is None:
        return None
    try:
        fields = json.loads(path.read_text())
    except OSError as exc:
        raise fail(f"{path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise fail(f"{path}: not JSON ({exc})") from None
    if not isinstance(fields, dict):
        raise fail(f"{path}: expected a JSON object of model config fields")
    return fields


def analyze_trace(
    path: Path,
    *,
    boundary: str | None = None,
    policy: str = "exclusive",
    format: str | None = None,
    mapping: Path | None = None,
    slo: dict[str, float] | None = None,
) -> Analysis:
    """Read ``path`` (:func:`load_trace`) and analyse it (:func:`ttft.analysis.analyze`),
    with the goodput of ``slo`` (limits in ms per metric) in its summary when given.

    Raises:
        typer.Exit: code 2 after printing what was wrong with the file or the mapping.
    """
    from ttft.analysis.pipeline import analyze

    table, _ = load_trace(path, format=format, mapping=mapping)
    with progress(f"attributing {table.num_rows:,} spans"):
        return analyze(table, boundary=boundary, policy=policy, trace=str(path), slo=slo)


def print_summary(analysis: Analysis, *, as_json: bool = False) -> None:
    """The analysis's summary on stdout: ``ttft analyze``'s tables, or its ``--json``."""
    print_summary_of(analysis.summary, as_json=as_json)


def print_summary_of(summary: Summary, *, as_json: bool = False) -> None:
    """A summary on stdout: ``ttft analyze``'s tables, or its ``--json``."""
    if as_json:
        import sys

        sys.stdout.write(summary.to_json() + "\n")
        return
    from ttft.reports.terminal import render_analysis

    render_analysis(summary, stdout_console())
