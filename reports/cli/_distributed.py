"""``--workers`` / ``--scheduler`` for a command: partitioned datasets analysed on Dask
(``ttft.reports.runs.distributed``), with a progress bar and errors as one line."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ttft.analysis.summary import Summary
from ttft.reports.cli._app import err, fail, model_config_fields

T = TypeVar("T")
_PASSES = 2
"""Tasks per partition the progress bar counts (the clock pass, then the analysis)."""


def on_dask(traces: Sequence[Path], format: str | None, scheduler: str | None,
            run: Callable[[Callable[[], None]], T]) -> T:
    """``run(on_done)`` under a progress bar of every partition of ``traces`` (``on_done``
    advances it by one task), with its errors as one line.

    Raises:
        typer.Exit: code 2 when a trace is not a dataset, Dask is missing, a dataset or the
            mapping cannot be read, a value is refused, or the scheduler cannot be reached.
    """
    from ttft.collectors import TraceFileError, dataset_info, is_dataset
    from ttft.reports.runs.distributed import DaskMissing

    if format not in (None, "ttft"):
        raise fail(f"--format {format}: --workers and --scheduler read ttft datasets only")
    for trace in traces:
        if not is_dataset(trace):
            raise fail(f"{trace}: not a partitioned dataset; --workers and --scheduler analyse "
                       f"one, made with: ttft partition {trace} -o DATASET --partitions N")
    try:
        n = sum(int(dataset_info(trace)["partitions"]) for trace in traces)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=err, transient=True, disable=not err.is_terminal
                      ) as bar:
            task = bar.add_task("partitions (clocks, then analysis)", total=_PASSES * n)
            return run(lambda: bar.advance(task))
    except DaskMissing as exc:
        raise fail(str(exc)) from None
    except (TraceFileError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        where = scheduler or ", ".join(map(str, traces))
        raise fail(f"{where}: {exc.strerror or exc}") from None


def _done(partitions: int, workers: int) -> None:
    err.print(f"analysed {partitions} partitions on {workers} Dask workers", markup=False,
              soft_wrap=True)


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
        typer.Exit: as `on_dask`.
    """
    from ttft.reports.runs.distributed import analyze_dataset

    result = on_dask([trace], format, scheduler, lambda on_done: analyze_dataset(
        trace, boundary=boundary, policy=policy, workers=workers, scheduler=scheduler,
        per_request=per_request, mapping=_named(mapping), slo=slo,
        on_done=on_done))
    _done(result.partitions, result.workers)
    return result.summary


def report_in_partitions(
    trace: Path,
    *,
    boundary: str | None,
    policy: str,
    mapping: Path | None,
    workers: int | None,
    scheduler: str | None,
    format: str | None = None,
    slo: dict[str, float] | None = None,
    model_config: Path | None = None,
    peak_tflops: float | None = None,
    peak_bandwidth_gbs: float | None = None,
) -> Any:
    """The ``ReportData`` of the dataset at ``trace``, made in partitions: what
    ``build_report`` makes of the whole in one process.

    Raises:
        typer.Exit: as `on_dask`, and when ``model_config`` cannot be read.
    """
    from ttft.reports.runs.distributed import report_dataset

    regime = {"model_config": model_config_fields(model_config), "model_origin": str(model_config),
              "peak_tflops": peak_tflops, "peak_bandwidth_gbs": peak_bandwidth_gbs}
    result = on_dask([trace], format, scheduler, lambda on_done: report_dataset(
        trace, boundary=boundary, policy=policy, workers=workers, scheduler=scheduler,
        mapping=_named(mapping), slo=slo, regime=regime,
        on_done=on_done))
    _done(result.partitions, result.workers)
    return result.data


def compare_in_partitions(
    traces: tuple[Path, Path],
    *,
    boundary: str | None,
    policy: str,
    mapping: Path | None,
    workers: int | None,
    scheduler: str | None,
    choose: Callable[[list[tuple[str, ...]]], str],
    format: str | None = None,
    slo: dict[str, float] | None = None,
) -> list[Any]:
    """Both datasets analysed in partitions on one cluster (a ``DatasetAnalysis`` each), at
    ``boundary``, else at ``choose(boundaries each supports)``.

    Raises:
        typer.Exit: as `on_dask`, and whatever ``choose`` raises.
    """
    from ttft.reports.runs.distributed import compare_datasets

    results = on_dask(list(traces), format, scheduler, lambda on_done: compare_datasets(
        traces, boundary=boundary, policy=policy, workers=workers, scheduler=scheduler,
        mapping=_named(mapping), slo=slo, choose=choose,
        on_done=on_done))
    _done(sum(r.partitions for r in results), results[0].workers)
    return results


def _named(path: Path | None) -> str | None:
    return None if path is None else str(path)
