"""Reading a trace for a command, in any format ttft imports: one error line (exit code 2)
naming the file on failure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import typer

from ttft.reports._app import fail, progress
from ttft.tracer.schema import METADATA_KEY

TraceArgument = Annotated[
    Path,
    typer.Argument(
        metavar="TRACE",
        help="a trace: ttft Parquet (a file or a directory of parts), OTLP JSON Lines or "
        "protobuf, Jaeger JSON, or Chrome trace JSON (PyTorch profiler)",
    ),
]
FormatOption = Annotated[
    str | None,
    typer.Option(
        "--format",
        help="input format: ttft, otlp-json, otlp-proto, jaeger or chrome (default: guessed "
        "from the file)",
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


def load_trace(
    path: Path, *, format: str | None = None, mapping: Path | None = None
) -> tuple[pa.Table, dict[str, Any]]:
    """The span table of ``path`` (a ttft trace file or directory of parts, or a file of
    another system's format) with stages mapped, and its run metadata.

    Raises:
        typer.Exit: code 2 after printing what was wrong with the file or the mapping.
    """
    from ttft.collectors.importers import TraceImportError, read_any

    rules = None
    if mapping is not None:
        from ttft.collectors.importers.mapping import load_mapping

        try:
            rules = load_mapping(mapping)
        except OSError as exc:
            raise fail(f"{mapping}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise fail(str(exc)) from None
    try:
        with progress(f"reading {path}"):
            table = read_any(path, format=format, mapping=rules)
    except TraceImportError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{path}: {exc.strerror or exc}") from None
    metadata = json.loads((table.schema.metadata or {}).get(METADATA_KEY, b"{}"))
    return table, metadata


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
