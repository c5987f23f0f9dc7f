"""Where a command analyses its traces: the one place ``--workers`` and ``--scheduler`` are
handled, for every command that takes them (analyze, report, compare).

`analysed` yields the runner (``ttft.reports.runs.analyses``) and each trace as a
``TraceLocation``; the command then calls the same driver whichever runner it got, so no
option exists on one side only. In this process each trace is read first, as every
command reads one (``load_trace``: the line on what a directory of runs held, the
deployment note, an unreadable file as one error line); on Dask each must be a partitioned
dataset, read one partition per task. Errors of either come out as one line; a progress
bar counts the partition tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ttft.reports.cli._app import (
    err,
    fail,
    load_trace,
    model_config_fields,
    note_staged,
    progress,
)

_PASSES = 2
"""Tasks per partition the progress bar counts (the clock pass, then the analysis)."""


@dataclass
class Where:
    """A command's runner, its traces as locations and the ``on_done`` to pass the driver."""

    runner: Any
    locations: list[Any]
    on_done: Callable[[], None] | None


@contextmanager
def analysed(traces: Sequence[Path], *, format: str | None, mapping: Path | None,
             workers: int | None, scheduler: str | None, what: str = "attributing"
             ) -> Iterator[Where]:
    """The `Where` of ``traces``: in this process without ``workers`` and ``scheduler``,
    else on Dask; the body's errors come out as one line.

    Raises:
        typer.Exit: code 2 when a trace cannot be read, is not a dataset (Dask), Dask is
            missing, a value is refused, or the scheduler cannot be reached.
    """
    from ttft.collectors import TraceFileError, TraceLocation
    from ttft.reports.runs.analyses import DaskMissing, runner

    named = None if mapping is None else str(mapping)
    try:
        if workers is None and scheduler is None:
            from ttft.analysis.kernel_warmup import warm_kernels

            stored = [TraceLocation(str(trace), format, named).stored_spans() for trace in traces]
            warm_kernels(max((n or 0 for n in stored), default=0))  # while the reads run
            locations = []
            for trace in traces:
                table, _ = load_trace(trace, format=format, mapping=mapping, native=True)
                locations.append(TraceLocation(str(trace), format, named, table))
            spans = sum(location.table.num_rows for location in locations)
            with runner() as here, progress(f"{what} {spans:,} spans"):
                yield Where(here, locations, None)
            return
        locations = [TraceLocation(str(trace), format, named) for trace in traces]
        _refuse_plain(locations, format)
        for trace in traces:
            note_staged(trace)
        n = sum(location.partitions() for location in locations)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with runner(workers, scheduler) as dask, Progress(
                *columns, console=err, transient=True, disable=not err.is_terminal) as bar:
            task = bar.add_task("partitions (clocks, then analysis)", total=_PASSES * n)
            yield Where(dask, locations, lambda: bar.advance(task))
            err.print(f"analysed {n} partitions on {dask.workers} Dask workers",
                      markup=False, soft_wrap=True)
    except DaskMissing as exc:
        raise fail(str(exc)) from None
    except (TraceFileError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        where = scheduler or ", ".join(map(str, traces))
        raise fail(f"{where}: {exc.strerror or exc}") from None


def _refuse_plain(locations: Sequence[Any], format: str | None) -> None:
    if format not in (None, "ttft"):
        raise fail(f"--format {format}: --workers and --scheduler read ttft datasets only")
    for location in locations:
        if location.kind != "dataset":
            raise fail(f"{location}: not a partitioned dataset; --workers and --scheduler "
                       f"analyse one, made with: ttft partition {location} -o DATASET "
                       "--partitions N")


def regime_options(model_config: Path | None, peak_tflops: float | None,
                   peak_bandwidth_gbs: float | None) -> dict[str, Any]:
    """``regime_setup``'s keyword arguments from a command's options, the model config
    read from the JSON file the user named.

    Raises:
        typer.Exit: code 2 when ``model_config`` cannot be read.
    """
    return {"model_config": model_config_fields(model_config),
            "model_origin": str(model_config), "peak_tflops": peak_tflops,
            "peak_bandwidth_gbs": peak_bandwidth_gbs}
