"""``ttft sweep``: trace a server at several load levels, one step each, and show where
TTFT goes as load rises; and ``ttft report SWEEP_DIR``, the report of such a sweep."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ttft.reports._text import plain
from ttft.reports.cli._app import app, err, fail, progress, stdout_console
from ttft.reports.cli._options import SloOption
from ttft.reports.cli._progress import RunDisplay
from ttft.reports.cli._workload import UrlArgument, Workload, workload_options

if TYPE_CHECKING:
    from ttft.reports.runs.sweep import SweepSpec


@app.command()
@workload_options(helps={"seed": (
    "the sweep's base seed: each step's prompts come from it and the step's index "
    "(default: a fresh one per sweep; recorded in sweep.json to repeat it)")})
def sweep(
    url: UrlArgument,
    out: Annotated[Path, typer.Option(
        "-o", "--out", metavar="SWEEP_DIR",
        help="directory to write: one trace per step (step-01-rate-1.parquet, ...) and "
        "sweep.json; a new or empty one, or an earlier sweep's (replaced)")],
    rates: Annotated[str | None, typer.Option(
        "--rates", metavar="R1,R2,...",
        help="one step per arrival rate (requests/s), e.g. 1,2,4,8")] = None,
    concurrency: Annotated[str | None, typer.Option(
        "--concurrency", metavar="C1,C2,...",
        help="one step per closed-loop concurrency (requests in flight), e.g. 1,2,4,8")] = None,
    slo: SloOption = None,
    goodput_target: Annotated[float, typer.Option(
        min=0.0, max=1.0,
        help="a step meets the SLO when at least this share of its requests meet every "
        "--slo; the knee is the highest level up to which every step meets it")] = 0.9,
    same_prompts: Annotated[bool, typer.Option(
        "--same-prompts", help="send every step the same prompts (by default each step "
        "gets fresh ones, so the server's prefix cache does not carry over)")] = False,
    *,
    workload: Workload,
    as_json: Annotated[bool, typer.Option("--json", help="print sweep.json's content")] = False,
) -> None:
    """Trace the server once per load level (--rates or --concurrency), lowest first, with
    the same workload shape at every step (--requests or --duration per step) and fresh
    prompts per step; write one trace per step and sweep.json: per step TTFT p50/p99,
    throughput, goodput (with --slo), failures and where TTFT goes (ms per stage of the
    requests near p50, each stage's mean and share), and the knee, the highest load
    meeting the SLO. A table row is printed as each step finishes. ttft report SWEEP_DIR
    shows it again; with -o sweep.html as a page of charts.

    A step that fails outright (the server went away) is recorded as failed and the sweep
    stops there, keeping every earlier step; the exit status is then 1."""
    from ttft.reports.runs.sweep import SweepSpec, parse_levels, run_sweep

    if (rates is None) == (concurrency is None):
        raise fail("give exactly one of --rates or --concurrency (e.g. --rates 1,2,4,8)")
    mode = "rate" if rates is not None else "concurrency"
    try:
        levels = parse_levels(rates if rates is not None else str(concurrency), mode)
    except ValueError as exc:
        raise fail(str(exc)) from None
    spec = SweepSpec(workload.spec(url), mode, levels, slo=slo, goodput_target=goodput_target,
                     same_prompts=same_prompts)
    try:
        content = run_sweep(spec, out, step_display=_StepDisplay(spec).step,
                            on_step=_StepRows(spec).print)
    except (ValueError, ConnectionError) as exc:  # before any step
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.filename or out}: {exc.strerror or exc}") from None
    _finish(content, out, as_json)


class _StepDisplay:
    """Each step's header line and live progress bar (``ttft trace``'s), on stderr."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec

    @contextlib.contextmanager
    def step(self, index: int, level: float) -> Iterator[dict[str, Any]]:
        from ttft.reports.views.sweep import level_text

        err.print(plain(f"step {index + 1}/{len(self.spec.levels)}: "
                        f"{level_text(self.spec.mode, level)}"))
        with RunDisplay(err) as display:
            yield display.callbacks()


class _StepRows:
    """A table of each step's figures, printed as the step finishes (on stderr with
    ``--json``, whose stdout is the JSON alone)."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec

    def print(self, step: dict[str, Any]) -> None:
        from ttft.reports.views.sweep import step_table

        err.print(step_table([step], self.spec.mode, slo=bool(self.spec.slo)))


def _finish(content: dict[str, Any], out: Path, as_json: bool) -> None:
    """Print the sweep (or its JSON), say where it is, and exit 1 if it stopped early."""
    ran = sum(1 for s in content["steps"] if s["status"] == "ok")
    if as_json:
        sys.stdout.write(json.dumps(content, indent=2) + "\n")
    else:
        from ttft.reports.views.sweep import render_sweep

        render_sweep(content, stdout_console())
    err.print(plain(f"{ran} of {len(content['levels'])} steps traced into {out}; summary: "
                    f"{out / 'sweep.json'}; ttft report {out} [-o sweep.html] shows it"))
    if content["stopped"]:
        err.print(plain(f"the sweep stopped early: {content['stopped']}", "yellow"),
                  soft_wrap=True)
        raise typer.Exit(code=1)


def report_sweep(path: str, out: Path | None) -> bool:
    """``ttft report`` of a sweep directory: the sweep's report in the terminal, or as the
    HTML page ``out``. False (nothing done) when ``path`` is not a sweep directory.

    Raises:
        typer.Exit: code 2 after an error line, when its sweep.json is not a sweep's or
        ``out`` cannot be written.
    """
    from ttft.reports.runs.sweep import read_sweep

    try:
        content = read_sweep(path)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if content is None:
        return False
    if out is None:
        from ttft.reports.views.sweep import render_sweep

        render_sweep(content, stdout_console())
        return True
    from ttft.reports.views.sweep import write_sweep_html

    try:
        with progress(f"writing {out}"):
            size = write_sweep_html(out, content)
    except OSError as exc:
        raise fail(f"{out}: cannot write ({exc.strerror or exc})") from None
    err.print(plain(f"wrote {out}: a sweep of {len(content['steps'])} steps, "
                    f"{size / 1e6:.1f} MB; open it in a browser (works offline)"))
    return True
