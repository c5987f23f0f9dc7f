"""``ttft analyze``: split every request's TTFT into stages and summarize them."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from ttft.reports._text import plain
from ttft.reports.cli._app import app, fail, print_summary, stdout_console
from ttft.reports.cli._options import (
    BoundaryOption,
    FormatOption,
    MappingOption,
    ModelConfigOption,
    PeakBandwidthOption,
    PeakTflopsOption,
    PolicyName,
    PolicyOption,
    RegimeFlag,
    SchedulerOption,
    SloOption,
    TraceArgument,
    WorkersOption,
)
from ttft.reports.cli._where import analysed, regime_options


@app.command()
def analyze(
    trace: TraceArgument,
    boundary: BoundaryOption = None,
    policy: PolicyOption = PolicyName["exclusive"],
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    per_request: Annotated[
        Path | None,
        typer.Option(help="write one row per request and stage to this Parquet file"),
    ] = None,
    format: FormatOption = None,
    mapping: MappingOption = None,
    regime: RegimeFlag = False,
    peak_tflops: PeakTflopsOption = None,
    peak_bandwidth_gbs: PeakBandwidthOption = None,
    model_config: ModelConfigOption = None,
    workers: WorkersOption = None,
    scheduler: SchedulerOption = None,
    slo: SloOption = None,
) -> None:
    """Split every request's TTFT into stages that sum exactly to it, and summarize them
    per stage and per condition (cold, prefix_hit), with the data-quality defects found;
    with --regime, also whether each prefill chunk was compute- or memory-bound. With
    --workers or --scheduler, a partitioned dataset (ttft partition) is analysed one
    partition per Dask task, with exactly the result of one process, every option alike.
    With --slo, also the goodput: the share and rate of requests meeting every SLO."""
    from ttft.reports.runs.analyses import analyze_location

    options = (regime_options(model_config, peak_tflops, peak_bandwidth_gbs) if regime
               else None)
    with analysed([trace], format=format, mapping=mapping, workers=workers,
                  scheduler=scheduler) as where:
        analysis = analyze_location(
            where.locations[0], where.runner, boundary=boundary.value if boundary else None,
            policy=policy.value, slo=slo, regime=options, on_done=where.on_done)
    if per_request is not None:
        try:
            _write_per_request(analysis.attribution, per_request)
        except OSError as exc:
            raise fail(f"{per_request}: cannot write ({exc.strerror or exc})") from None
    from ttft.reports.views.regime import profile_line

    # A prefill profile has prefill spans and no requests: its 0 requests and N no_window
    # defects would describe a request trace that it is not.
    profile = None if as_json else profile_line(analysis.metadata, analysis.assembly)
    if profile is not None:
        stdout_console().print(plain(f"ttft analyze {trace}: {profile}", "bold"))
    if not regime:
        if profile is not None:
            stdout_console().print(plain("its roofline regime: add --regime"))
        else:
            print_summary(analysis, as_json=as_json)
        return
    found = analysis.regime_result
    assert found is not None
    if as_json:
        out = {**analysis.summary.to_dict(), "regime": _regime_json(found)}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    from ttft.reports.views.regime import render_regime

    if profile is None:
        print_summary(analysis)
    render_regime(found, stdout_console())


def _write_per_request(attribution, path: Path) -> None:
    """``--per-request``: the attribution's ``per_request`` rows. In one piece, as one
    table; in several (a dataset analysed on Dask, read back one part at a time, never
    stacked), each piece is written beside the file first, then all are written into it
    with their schemas unified (a part whose rows have no condition types it null)."""
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    pieces: list[str] = []
    scratch = tempfile.mkdtemp(prefix=".per-request-", dir=Path(path).parent or ".")

    def write(frame) -> None:
        piece = f"{scratch}/{len(pieces):06d}.parquet"
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), piece)
        pieces.append(piece)

    try:
        attribution.per_request_parts(write)
        if len(pieces) == 1:
            os.replace(pieces[0], path)
            return
        schema = pa.unify_schemas([pq.read_schema(p) for p in pieces],
                                  promote_options="permissive")
        with pq.ParquetWriter(path, schema) as writer:
            for piece in pieces:
                writer.write_table(pq.read_table(piece).cast(schema))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _regime_json(found) -> dict:
    """The ``regime`` key of ``analyze --json --regime``: the peaks used (or null), how far
    the chunks went past them (``above_roofline``, `RooflineExcess`'s fields, or null) and
    the summary rows (an empty list without a model shape); NaN becomes null."""
    peaks, excess = found.peaks, found.excess
    rows = [] if found.summary is None else json.loads(found.summary.to_json(orient="records"))
    return {
        "peaks": None
        if peaks is None
        else {
            "flops_per_s": peaks.flops_per_s,
            "bytes_per_s": peaks.bytes_per_s,
            "device": peaks.device,
            "source": peaks.source,
        },
        # Chunks above the roofline (no fraction in their rows): the device did at least
        # the best rates, so no peak above stands as the device's.
        "above_roofline": None if excess is None else dataclasses.asdict(excess),
        "model_known": found.model_known,
        "rows": rows,
    }
