"""``ttft import``: convert another system's trace file into a ttft Parquet trace."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from ttft.reports._text import labelled, plain
from ttft.reports.cli._app import app, err, fail, load_trace, progress
from ttft.reports.cli._options import FormatOption, MappingOption, TraceArgument


@app.command("import")
def import_trace(
    trace: TraceArgument,
    out: Annotated[Path, typer.Option("-o", "--out", help="ttft trace to write (.parquet)")],
    format: FormatOption = None,
    mapping: MappingOption = None,
) -> None:
    """Read a trace of another system (OTLP JSON Lines or protobuf from an OpenTelemetry
    Collector, Jaeger JSON, Chrome trace JSON from the PyTorch profiler, NVIDIA Dynamo's
    request trace JSON Lines), map its span names
    onto ttft's stages (built-in rules for vLLM, SGLang and TGI, plus --mapping), and write
    it as one ttft Parquet trace. ttft analyze, report and export also read these files
    directly; importing once saves parsing them again."""
    import pyarrow.compute as pc

    from ttft.collectors import write_trace

    if out.resolve() == Path(trace).resolve():
        raise fail(f"{out}: the output would overwrite the input")
    started = time.perf_counter()
    table, metadata = load_trace(trace, format=format, mapping=mapping)
    try:
        with progress(f"writing {out}"):
            write_trace(out, table, metadata)
    except OSError as exc:
        raise fail(f"{out}: cannot write ({exc.strerror or exc})") from None
    counted = pc.value_counts(table.column("stage")).to_pylist()
    stages = Counter({c["values"]: c["counts"] for c in counted})
    traces = pc.count_distinct(table.column("trace_id")).as_py()
    mapped = ", ".join(f"{stage} {n:,}" for stage, n in stages.most_common())
    err.print(
        plain(
            f"read {trace} ({metadata.get('source_format', 'ttft')}): {table.num_rows:,} rows "
            f"in {traces:,} traces ({mapped}); wrote {out} in "
            f"{time.perf_counter() - started:.1f} s"
        ),
        soft_wrap=True,
    )
    if stages.get("other", 0) == table.num_rows and table.num_rows:
        err.print(
            labelled(
                "note:",
                "yellow",
                'no span name matched a stage; add rules with --mapping (see README, '
                '"Importing traces")',
            ),
            soft_wrap=True,
        )
