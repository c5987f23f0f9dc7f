"""``--workers`` / ``--scheduler`` for a command: a partitioned dataset analysed on Dask
(``ttft.reports.runs.distributed``), with a progress bar and errors as one line."""

from __future__ import annotations

from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ttft.analysis.summary import Summary
from ttft.reports.cli._app import err, fail


def analyze_in_partitions(
    trace: Path,
    *,
    boundary: str | None,
    policy: str,
    mapping: Path | None,
    workers: int | None,
    scheduler: str | None,
    per_request: Path | None,
    format: str | None = None,
    slo: dict[str, float] | None = None,
) -> Summary:
    """The summary of the dataset at ``trace``, analysed in partitions.

    Raises:
        typer.Exit: code 2 when ``trace`` is not a dataset, Dask is missing, the dataset or
            the mapping cannot be read, or the scheduler cannot be reached.
    """
    from ttft.collectors import TraceFileError, dataset_info, is_dataset
    from ttft.reports.runs.distributed import DaskMissing, analyze_dataset

    if format not in (None, "ttft"):
        raise fail(f"--format {format}: --workers and --scheduler read ttft datasets only")
    if not is_dataset(trace):
        raise fail(f"{trace}: not a partitioned dataset; --workers and --scheduler analyse "
                   f"one, made with: ttft partition {trace} -o DATASET --partitions N")
    try:
        n = int(dataset_info(trace)["partitions"])
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=err, transient=True, disable=not err.is_terminal
                      ) as bar:
            task = bar.add_task("partitions (clocks, then attribution)", total=2 * n)
            result = analyze_dataset(
                trace, boundary=boundary, policy=policy, workers=workers,
                scheduler=scheduler, per_request=per_request,
                mapping=None if mapping is None else str(mapping), slo=slo,
                on_done=lambda: bar.advance(task),
            )
    except DaskMissing as exc:
        raise fail(str(exc)) from None
    except (TraceFileError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        where = scheduler or trace
        raise fail(f"{where}: {exc.strerror or exc}") from None
    err.print(f"analysed {n} partitions on {result.workers} Dask workers", markup=False,
              soft_wrap=True)
    return result.summary
