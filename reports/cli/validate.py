"""``ttft validate``: inject known delays into the reference engine and check that
attribution gives them back."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from ttft.reports._text import plain
from ttft.reports.cli._app import app, err, fail, progress, require_engine, stdout_console


def _parse_delays(values: list[str]) -> dict[str, float]:
    """``STAGE=MS`` pairs → ``{stage: ms}`` (a later pair for a stage wins)."""
    out: dict[str, float] = {}
    for value in values:
        stage, sep, ms = value.partition("=")
        try:
            if not sep or not stage.strip():
                raise ValueError
            out[stage.strip()] = float(ms)
        except ValueError:
            raise fail(f"--delay {value!r}: expected STAGE=MS, e.g. queue=30") from None
    return out


@app.command()
def validate(
    requests: Annotated[int, typer.Option(min=1, help="requests per phase")] = 40,
    model: Annotated[str, typer.Option(help="model preset: tiny, small or base")] = "small",
    delay: Annotated[
        list[str] | None,
        typer.Option(
            help="STAGE=MS to inject (repeatable; default tokenize=20 queue=30 sample=10 "
            "detokenize=5, and kv_transfer=15 with --disaggregate)"
        ),
    ] = None,
    disaggregate: Annotated[
        bool,
        typer.Option(help="serve a prefill worker process and the decode worker (the first "
                     "token after the K/V transfer), so kv_transfer can be delayed too"),
    ] = False,
    preemption: Annotated[
        bool,
        typer.Option(help="then run the preemption case: a K/V pool too small for its "
                     "requests, recompute preemption on, the preempted stage checked in "
                     "TTFT and blame (not with --disaggregate)"),
    ] = True,
    out: Annotated[Path, typer.Option("-o", "--out", help="folder for the traces")] = Path(
        "ttft-validate"
    ),
    seed: Annotated[int, typer.Option(help="seed for the weights and the prompts")] = 0,
) -> None:
    """Run the reference engine at concurrency 1 without, then with, known delays in
    chosen stages; check at the server boundary that each stage's median attributed time
    rose by the injected delay within max(1 ms, 5 %). Exit 0 when every delay is
    recovered (and the preemption case passes), 1 on a miss, 2 on bad input."""
    require_engine("validate")
    from ttft.engine.model import ModelConfig
    from ttft.reports.runs.validate import (
        DEFAULT_DELAYS_MS,
        DISAGG_DEFAULT_DELAYS_MS,
        check_delays,
        run_validate,
    )

    defaults = DISAGG_DEFAULT_DELAYS_MS if disaggregate else DEFAULT_DELAYS_MS
    try:
        delays = check_delays(_parse_delays(delay) if delay else defaults,
                              disaggregate=disaggregate)
        ModelConfig.preset(model)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if not delays:
        raise fail("no delay to inject: give at least one --delay STAGE=MS")
    preemption = preemption and not disaggregate  # the disaggregated engine never preempts
    stages = ", ".join(f"{s}={ms:g}" for s, ms in delays.items())
    mode = " disaggregated" if disaggregate else ""
    case = ", then the preemption case" if preemption else ""
    try:
        with progress(f"validating {model!r}{mode}: {requests} requests without, then with "
                      f"{stages}{case}"):
            result = run_validate(out, requests=requests, model=model, delays_ms=delays,
                                  seed=seed, disaggregate=disaggregate, preemption=preemption)
    except OSError as exc:
        raise fail(f"{out}: {exc.strerror or exc}") from None
    from ttft.reports.views.validate import render_preemption, render_validate

    stdout_console().print(render_validate(result))
    if result.preemption is not None:
        stdout_console().print(render_preemption(result.preemption))
    for line in result.failures:
        err.print(plain(line, "red"))
    misses = [c.stage for c in result.stages if not c.ok]
    misses += [] if result.preemption is None or result.preemption.ok else ["preemption"]
    verdict = (
        plain(f"missed: {', '.join(misses)}", "red")
        if misses
        else Text(f"all {len(result.stages)} delays recovered"
                  + (", preemption checked" if result.preemption is not None else ""))
    )
    err.print(
        Text.assemble(
            verdict,
            plain(
                f" ({result.seconds:.1f} s); the TTFT row is informational (prefill varies "
                f"between phases); traces: {result.baseline.trace}, {result.injected.trace}"
                + (f", {result.preemption.trace}" if result.preemption is not None else "")
            ),
        )
    )
    if not result.ok:
        raise typer.Exit(code=1)
