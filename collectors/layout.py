"""How a ttft trace lies on disk, and which runs a path holds.

A finished run is one Parquet file. A run being written (or whose writer was killed) is
``<file>.parts/``: part files, each written whole under a temporary name and renamed, and
the span-log segments no part covers yet. A directory of runs (what ``ttft collect --out``
fills) holds one file per finished run and one ``<file>.parts/`` per unfinished one
(docs/design.md, "The span record"). `ttft.collectors.location.TraceLocation` resolves a
path through :func:`trace_runs`; readers and writers use the layout below it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ttft.collectors.errors import TraceFileError
from ttft.tracer.schema import METADATA_KEY, SPAN_SCHEMA, SPAN_SCHEMA_V2
from ttft.tracer.span_ids import is_v2, to_v1, to_v2

PARTS_SUFFIX = ".parts"
"""A writer's part files live in ``<path>.parts/`` until they are merged into ``<path>``."""

WRITE_OPTIONS: dict = {
    # Measured by benchmarks/storage.py (about 24 B/span on synthetic traces, from 31 with
    # zstd alone; rows grouped by trace, `_by_trace`): dictionaries for the columns that
    # repeat (parents have several children), random span ids as length-prefixed runs zstd
    # packs to their 8 bytes of entropy, times as deltas (rows of a trace are close in time).
    "compression": "zstd",
    "dictionary_pagesize_limit": 64 << 20,  # past 1 MiB (20k traces) pyarrow drops to plain
    "use_dictionary": ["trace_id", "parent_id", "request_id", "name", "stage", "clock", "service"],
    "column_encoding": {
        "span_id": "DELTA_LENGTH_BYTE_ARRAY",
        "start_ns": "DELTA_BINARY_PACKED",
        "end_ns": "DELTA_BINARY_PACKED",
        "attributes": "DELTA_BYTE_ARRAY",
    },
}
WRITE_OPTIONS_V2: dict = {
    # The same for ids as bytes (schema version 2): 8 random bytes a span id, written as
    # they are. Trace, parent and request ids and the attributes plain too, no dictionary
    # and no deltas: zstd packs a trace's runs and a parent's repeats as well or better,
    # and plain values decode fastest. Measured on 23.8M spans (benchmarks/attribution.py's
    # trace, one column read at a time): trace ids 25.7 MB and 0.10 s against 28.9 MB and
    # 0.30 s; parent ids 58.9 MB and 0.15 s against 85.9 MB and 0.53 s; attributes 0.57 s
    # against 0.97 s (DELTA_BYTE_ARRAY); request ids as small, no slower. The storage
    # benchmark: 21.1 B/span against 22.8.
    **WRITE_OPTIONS,
    "use_dictionary": [c for c in WRITE_OPTIONS["use_dictionary"]
                       if c not in ("trace_id", "parent_id", "request_id")],
    "column_encoding": {k: v for k, v in WRITE_OPTIONS["column_encoding"].items()
                        if k not in ("span_id", "attributes")},
}


def as_stored(table: pa.Table) -> tuple[pa.Table, dict]:
    """``table`` as a file holds it, and the options to write it with: its ids as bytes
    (schema version 2, ``tracer.span_ids.to_v2``) where every id is W3C hex, else as text
    (version 1, which a file may hold forever)."""
    stored = to_v2(table)
    return (table, WRITE_OPTIONS) if stored is None else (stored, WRITE_OPTIONS_V2)


def write_options(schema: pa.Schema) -> dict:
    """The options to write a table of ``schema``'s layout with (`as_stored`)."""
    return WRITE_OPTIONS_V2 if is_v2(schema) else WRITE_OPTIONS


def joined_layout(files: list[Path], v2: bool = True
                  ) -> tuple[pa.Schema, Callable[[pa.Table], pa.Table]]:
    """How files `as_stored` wrote join into one: the joined file's schema (no metadata)
    and what each of their tables becomes in it. Ids as bytes when every file holds them
    so and ``v2`` (whatever else joins them can be), else as text throughout."""
    if v2 and all(is_v2(pq.read_schema(f)) for f in files):
        return SPAN_SCHEMA_V2, lambda table: table
    return SPAN_SCHEMA, to_v1


_PART_RE = re.compile(r"^part-(\d+)\.parquet$")
_LOG_RE = re.compile(r"^log-(\d+)\.spans$")


def log_name(index: int) -> str:
    """The name of the span-log segment whose rows part ``index`` will hold
    (``ttft.collectors._log``)."""
    return f"log-{index:05d}.spans"


def log_index(name: str) -> int | None:
    """The part index of a segment's file name, or None if it is not a segment."""
    match = _LOG_RE.match(name)
    return int(match.group(1)) if match else None


def parts_dir(path: str | os.PathLike[str]) -> Path:
    """The directory where a writer of ``path`` keeps its part files."""
    return Path(os.fspath(path) + PARTS_SUFFIX)


def _part_key(name: str) -> tuple[int, int, str]:
    match = _PART_RE.match(name)
    return (0, int(match.group(1)), name) if match else (1, 0, name)


def part_files(directory: Path) -> list[Path]:
    """Visible ``*.parquet`` files of ``directory`` in part order; temp dot-files excluded."""
    if not directory.is_dir():
        return []
    names = [
        entry.name for entry in os.scandir(directory)
        if entry.is_file() and entry.name.endswith(".parquet")
        and not entry.name.startswith((".", "_"))
    ]
    return [directory / name for name in sorted(names, key=_part_key)]


def log_files(directory: Path) -> list[tuple[int, Path]]:
    """The span-log segments of a parts directory (``log-NNNNN.spans``), by part index."""
    if not directory.is_dir():
        return []
    found = []
    for entry in os.scandir(directory):
        index = log_index(entry.name)
        if index is not None and entry.is_file():
            found.append((index, directory / entry.name))
    return sorted(found)


def uncovered_logs(directory: Path) -> list[tuple[int, Path]]:
    """The segments whose part is missing: their rows are read from the log itself (a part
    that exists holds every row of its segment)."""
    return [(index, path) for index, path in log_files(directory)
            if not (directory / f"part-{index:05d}.parquet").exists()]


def fsync(path: Path) -> None:
    """Make ``path`` durable: a file's data, or a directory's entries (a file created or
    renamed in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard(tmp: Path) -> None:
    """Remove a temporary file after a failed write. A failure here (e.g. its directory is
    gone) is ignored, so it never hides why the write failed; readers skip dot-files."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def by_trace(table: pa.Table) -> pa.Table:
    """The rows of each trace together, traces in order of their first row, rows of a trace
    in their order: a trace's id then repeats in runs and its times are close, which is
    what makes a file small (readers never depend on row order)."""
    if table.num_rows < 2:
        return table
    codes = pc.dictionary_encode(table.column("trace_id")).combine_chunks().indices
    codes = codes.to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")  # codes number traces by first appearance
    if (order[1:] > order[:-1]).all():
        return table
    return table.take(order)


@contextlib.contextmanager
def _replacing(dest: Path) -> Iterator[Path]:
    """Yield a dot-named temporary beside ``dest`` to write; once the block ends, fsync it
    and rename it over ``dest`` (readers see the old file or the new one, never a part of
    one). The temporary is removed if anything fails."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        yield tmp
        fsync(tmp)
        os.replace(tmp, dest)
    except BaseException:
        discard(tmp)
        raise


def replace_bytes(dest: Path, data: bytes) -> None:
    """Write ``data`` to ``dest`` whole (`_replacing`) and durably: the directory is
    fsynced after the rename, so the new file survives a crash once this returns."""
    with _replacing(dest) as tmp:
        tmp.write_bytes(data)
    fsync(dest.parent)


def write_atomic(dest: Path, table: pa.Table, metadata_json: bytes,
                 extra: dict[bytes, bytes] | None = None) -> None:
    """Write ``table`` to ``dest`` via a temporary dot-name, so ``dest`` is always whole
    (`_replacing`; the directory is not fsynced here); ``extra`` schema metadata beside
    the run metadata."""
    with _replacing(dest) as tmp:
        table, options = as_stored(by_trace(table))
        table = table.replace_schema_metadata({METADATA_KEY: metadata_json, **(extra or {})})
        pq.write_table(table, tmp, **options)


# --- the runs a path holds ---------------------------------------------------------------


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


def stored_spans(path: str | os.PathLike[str]) -> int | None:
    """The spans the finished Parquet runs at ``path`` hold, from their footers alone (no
    row is read), or None when that is not known in advance: a run still being written,
    a file in another format, nothing readable there. A hint for sizing work before the
    read (`ttft.analysis.kernel_warmup`), never a count the analysis relies on."""
    try:
        runs = trace_runs(path)
        if not all(run.finished for run in runs):
            return None
        return sum(pq.ParquetFile(run.parts[0]).metadata.num_rows for run in runs)
    except (TraceFileError, OSError, pa.ArrowException):
        return None
