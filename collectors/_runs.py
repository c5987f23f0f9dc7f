"""Which runs a path holds: a finished trace file, a writer's parts directory (its parts and
the log segments no part covers yet), or a directory of runs such as ``ttft collect --out``
fills: one file per finished run and one ``<file>.parts/`` per run still being written or
killed (docs/design.md, "The span record")."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ttft.collectors._files import PARTS_SUFFIX, log_files, part_files, parts_dir, uncovered_logs
from ttft.collectors.errors import TraceFileError


@dataclass
class Run:
    """One run's files: ``path`` is the trace file, or the parts directory of an unfinished
    run; ``parts`` its Parquet files in order; ``logs`` the segments no part covers."""

    path: Path
    finished: bool
    parts: list[Path]
    logs: list[Path] = field(default_factory=list)


def _is_parts_dir(directory: Path) -> bool:
    return directory.name.endswith(PARTS_SUFFIX) or bool(log_files(directory))


def unfinished_run(directory: Path) -> Run:
    """The run a writer is writing (or was, when it was killed) in ``directory``."""
    return Run(directory, False, part_files(directory),
               [path for _, path in uncovered_logs(directory)])


def _finished_of(directory: Path) -> Path:
    """The trace file a parts directory becomes when its writer closes."""
    return directory.with_name(directory.name.removesuffix(PARTS_SUFFIX))


def trace_runs(path: str | os.PathLike[str]) -> list[Run]:
    """The runs to read at ``path``, in name order.

    ``path`` may be a trace file; a missing trace whose ``<path>.parts`` exists (a writer
    that did not close: read as that directory); a parts directory (named ``*.parts`` or
    holding log segments); or a directory of runs: each visible ``*.parquet`` file in it is
    a finished run, each ``<name>.parts`` directory whose ``<name>`` is not there yet an
    unfinished one (once ``<name>`` exists, the directory is what its merge left behind).
    A plain directory of part files reads as that many finished runs.

    Raises:
        TraceFileError: nothing at ``path``, or a directory that holds no run.
    """
    target = Path(path)
    if not target.exists():
        if not parts_dir(target).is_dir():
            raise TraceFileError(target, "does not exist")
        target = parts_dir(target)
    if not target.is_dir():
        return [Run(target, True, [target])]
    if _is_parts_dir(target):
        run = unfinished_run(target)
        if not run.parts and not run.logs:
            raise TraceFileError(target, "directory holds no Parquet part files or span logs")
        return [run]
    runs = [Run(file, True, [file]) for file in part_files(target)]
    for entry in sorted(os.scandir(target), key=lambda e: e.name):
        child = target / entry.name
        if (entry.name.endswith(PARTS_SUFFIX) and not entry.name.startswith(".")
                and entry.is_dir() and not _finished_of(child).exists()):
            runs.append(unfinished_run(child))
    if not runs:
        raise TraceFileError(target, "directory holds no ttft trace (no .parquet files, "
                                     "no <name>.parts directories of unfinished runs)")
    return sorted(runs, key=lambda run: run.path.name)


def refreshed(run: Run) -> Run:
    """The same run looked at again, after one of its files vanished while being read: its
    writer wrote the part that covers a log segment, or closed and merged the parts."""
    if run.finished:
        return run
    finished = _finished_of(run.path)
    if run.path.name.endswith(PARTS_SUFFIX) and finished.is_file():
        return Run(finished, True, [finished])
    return unfinished_run(run.path)
