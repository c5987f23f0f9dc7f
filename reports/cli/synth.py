"""``ttft synth``: write a realistic synthetic trace (and the attribution it expects)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from ttft.reports.cli._app import app, err, fail, progress


@app.command()
def synth(
    out: Annotated[Path, typer.Option("-o", "--out", help="trace file to write (.parquet)")],
    requests: Annotated[int, typer.Option(min=1, help="number of requests")] = 1000,
    seed: Annotated[int, typer.Option(help="seed for everything random")] = 0,
    expected: Annotated[
        bool,
        typer.Option(help="also write the attribution the generator expects, beside OUT"),
    ] = False,
) -> None:
    """Write a realistic synthetic trace: client, server, engine and GPU spans that overlap
    the way real ones do (GPU work outlasting its host span, a neighbour's steps between
    prefill chunks, a client window around the server's), some prefix-cache hits."""
    from ttft.collectors import write_trace
    from ttft.collectors.synthetic import expected_path, generate, write_expected

    started = time.perf_counter()
    with progress(f"generating {requests:,} requests"):
        synthetic = generate(requests, seed=seed)
    try:
        with progress(f"writing {out}"):
            write_trace(out, synthetic.table, synthetic.metadata)
            if expected:
                write_expected(synthetic, expected_path(out))
    except OSError as exc:
        raise fail(f"{out}: cannot write ({exc.strerror or exc})") from None
    took = time.perf_counter() - started
    err.print(
        f"wrote {out}: {requests:,} requests, {synthetic.table.num_rows:,} spans "
        f"in {took:.1f} s" + (f"; expected attribution in {expected_path(out)}" if expected else "")
    )
