"""The options and arguments several commands share, declared once (the workload options
of ``trace`` and ``sweep``: :mod:`ttft.reports.cli._workload`)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ttft.tracer.schema import BOUNDARY_NAMES, POLICIES

BoundaryName = Enum("BoundaryName", {b: b for b in BOUNDARY_NAMES}, type=str)  # type: ignore[misc]
PolicyName = Enum("PolicyName", {p: p for p in POLICIES}, type=str)  # type: ignore[misc]
BoundaryOption = Annotated[
    BoundaryName | None,
    typer.Option(help="TTFT boundary (default: the outermost the trace supports)"),
]
PolicyOption = Annotated[PolicyName, typer.Option(help="how overlapping spans share a segment")]
TraceArgument = Annotated[
    str,  # not Path: a dataset may be a URL (s3://...), which Path would fold to s3:/...
    typer.Argument(
        metavar="TRACE",
        help="a trace: ttft Parquet (a file, a directory of parts or of runs, or a "
        "partitioned dataset: a path or an fsspec URL), OTLP JSON Lines or protobuf, "
        "Jaeger JSON, or Chrome trace JSON (PyTorch profiler)",
    ),
]
FormatOption = Annotated[
    str | None,
    typer.Option(
        "--format",
        help="input format: ttft, otlp-json, otlp-proto, jaeger, chrome or dynamo (default: "
        "guessed from the file)",
    ),
]
MappingOption = Annotated[
    Path | None,
    typer.Option(
        "--mapping",
        help="TOML file of extra rules mapping (service, span name, attribute) to a stage; "
        "they win over the built-in ones for vLLM, SGLang and TGI",
    ),
]


RegimeFlag = Annotated[
    bool,
    typer.Option(
        "--regime",
        help="also show each prefill chunk's roofline regime (FLOPs and bytes from the model "
        "shape against the traced device's peaks)",
    ),
]
PeakTflopsOption = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        help="peak FLOP/s of the traced device, in TFLOP/s, when the "
        "trace has no measured peaks and its device is not a known GPU",
    ),
]
PeakBandwidthOption = Annotated[
    float | None,
    typer.Option(min=0.0, help="peak memory bandwidth of the traced device, in GB/s"),
]
ModelConfigOption = Annotated[
    Path | None,
    typer.Option(
        help="the model's config as JSON (a Hugging Face config.json or ttft "
        "ModelConfig fields, with dtype) when the trace does not carry it"
    ),
]


WorkersOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="analyse a partitioned dataset (ttft partition) on a local Dask cluster of N "
        "worker processes, one task per partition (needs: pip install 'ttft[dask]')",
    ),
]
SchedulerOption = Annotated[
    str | None,
    typer.Option(
        metavar="ADDRESS",
        help="analyse a partitioned dataset on the running Dask scheduler at ADDRESS "
        "(tcp://host:8786); every worker must be able to read the dataset",
    ),
]


_SLO_UNITS_MS = {"ms": 1.0, "s": 1000.0}
_SLO_EXAMPLE = "ttft=500ms,tpot=50ms,itl=30ms,e2e=2s"


def parse_slo(text: str) -> dict[str, float]:
    """``--slo``'s value: comma-separated ``metric=number unit`` (``ms`` or ``s``) for the
    metrics of ``ttft.analysis.load.SLO_METRICS``, as ms per metric.

    Raises:
        typer.BadParameter: naming the part that is not understood (exit status 2).
    """
    from ttft.analysis.load import SLO_METRICS

    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        name, _, value = part.partition("=")
        name, value = name.strip(), value.strip().lower()
        if name not in SLO_METRICS:
            raise typer.BadParameter(
                f"{part!r}: the metric must be one of {', '.join(SLO_METRICS)} "
                f"(as in {_SLO_EXAMPLE})")
        if name in out:
            raise typer.BadParameter(f"{part!r}: {name} is given twice")
        unit = "ms" if value.endswith("ms") else "s" if value.endswith("s") else ""
        try:
            number = float(value[: len(value) - len(unit)]) if unit else float("nan")
        except ValueError:
            number = float("nan")
        if not unit or not number > 0 or number == float("inf"):
            raise typer.BadParameter(
                f"{part!r}: the limit must be a positive number with a unit, ms or s "
                f"(as in {_SLO_EXAMPLE})")
        out[name] = number * _SLO_UNITS_MS[unit]
    return out


SloOption = Annotated[
    dict | None,
    typer.Option(
        "--slo",
        metavar="METRIC=LIMIT,...",
        parser=parse_slo,
        help="service-level objectives for goodput: the share and rate of requests meeting "
        f"all of them (metrics ttft, tpot, itl, e2e; units ms or s; e.g. {_SLO_EXAMPLE}); "
        "a failed request meets none",
    ),
]
