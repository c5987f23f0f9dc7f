"""The one way to read a trace: any format ttft imports, stages mapped once, here.

Every command and library function reads through :func:`read_spans`, so two commands never
give two answers for one file: ttft's own Parquet (a file or a directory of parts) and the
other systems' formats (`ttft.collectors.importers.IMPORTERS`) all come back with exactly
``SPAN_SCHEMA`` and with serving stacks' span names mapped onto ttft's stages
(`ttft.collectors.importers.mapping`). A trace written by ``ttft collect`` or ``ttft trace``
may hold a vLLM server's spans: the mapping applies to ttft's format too.
"""

from __future__ import annotations

import os
import select
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pyarrow as pa

from ttft.collectors.dataset import (
    DATASET_FILE,
    is_dataset,
    is_url,
    read_dataset,
    read_partition,
)
from ttft.collectors.errors import TraceFileError
from ttft.collectors.importers import IMPORTERS
from ttft.collectors.importers._base import MAX_DECOMPRESSED_BYTES, head
from ttft.collectors.importers.mapping import StageMapping, default_mapping, load_mapping
from ttft.collectors.layout import parts_dir
from ttft.tracer.schema import OWN_ROWS_KEY, read_inputs, run_metadata, with_run_metadata
from ttft.tracer.span_ids import is_v2, to_v1

__all__ = ["FIFO_WAIT_S", "STDIN", "guess_format", "read_inputs", "read_spans", "run_metadata"]

STDIN = "-"
"""The path that reads standard input."""

FIFO_WAIT_S = 30.0
"""How long reading a FIFO waits for a writer before it gives up."""

_CHUNK_BYTES = 1 << 20
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _exists(path: Path) -> bool:
    """``path`` exists, or is a ttft trace a crashed writer left as ``path.parts/``."""
    return path.exists() or parts_dir(path).is_dir()


def guess_format(path: str | os.PathLike[str]) -> str:
    """The name of the first importer that can open ``path``.

    Raises:
        TraceFileError: the path does not exist, or no importer recognises it (a
            zstd-compressed file is named as such: no importer decompresses zstd).
    """
    if is_url(path):
        if not is_dataset(path):
            raise TraceFileError(path, "not a partitioned dataset; ttft reads a URL only as "
                                       f"a dataset (a directory holding {DATASET_FILE})")
        return "ttft"
    path = Path(path)
    if not _exists(path):
        raise TraceFileError(path, "does not exist")
    for name, importer in IMPORTERS.items():
        if importer.guess_can_open(path):
            return name
    if head(path, 4) == _ZSTD_MAGIC:
        raise TraceFileError(path, "zstd-compressed, which ttft does not read; decompress it "
                                   "(zstd -d) or gzip it")
    expected = "; ".join(f"{i.description} (--format {n})" for n, i in IMPORTERS.items())
    raise TraceFileError(path, f"not a trace format ttft reads; expected one of: {expected}")


def _mapping(mapping: StageMapping | str | os.PathLike[str] | None) -> StageMapping:
    """The rules to apply: the built-in table, ``mapping`` itself, or the built-in table
    extended by the TOML file at ``mapping``."""
    if mapping is None:
        return default_mapping()
    if isinstance(mapping, StageMapping):
        return mapping
    return load_mapping(mapping)


def read_spans(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    mapping: StageMapping | str | os.PathLike[str] | None = None,
    partition: int | None = None,
    native: bool = False,
) -> pa.Table:
    """Read a trace in any format, with stages mapped.

    Args:
        path: a trace file, or a directory of ttft part files (also the ``<path>.parts``
            directory a writer that did not close left behind), or a partitioned dataset
            (``ttft.collectors.dataset``: every partition's own rows; also at a URL such as
            ``s3://``, through fsspec); ``-`` for standard input,
            or a FIFO. A stream is read once, to its end (at most
            `MAX_DECOMPRESSED_BYTES`; a FIFO waits `FIFO_WAIT_S` for a writer), into a
            temporary file whose first bytes pick the format; errors and the ``source``
            metadata name the stream (``<stdin>`` or the FIFO's path).
        format: an `IMPORTERS` name (``ttft``, ``otlp-json``, ``otlp-proto``, ``jaeger``,
            ``chrome``, ``dynamo``); None to guess from the file's first bytes.
        mapping: the stage rules: None for the built-in ones (vLLM, SGLang, TGI); the path
            of a TOML rules file, whose rules are tried before the built-in ones; or a
            `StageMapping`, applied as it is (e.g. ``default_mapping().extended(mine)``).
        partition: of a partitioned dataset, read only partition ``partition``: its own
            rows, then copies of the step traces its requests joined, how many rows it
            owns under ``OWN_ROWS_KEY`` in the schema metadata (None: the whole trace).
        native: keep the ids as bytes where the files hold them so (schema version 2,
            ``SPAN_SCHEMA_V2``: what the analysis reads fastest) and no stage rule acts on
            the table; else, the default, the ids as hex text.

    Returns:
        A table with exactly ``SPAN_SCHEMA`` (with ``native``, maybe ``SPAN_SCHEMA_V2``)
        whose schema metadata holds the run metadata under ``METADATA_KEY`` (see
        :func:`run_metadata`).

    Raises:
        TraceFileError: the path is missing or unrecognised, the format name unknown, the
            file breaks its format (named by file and row, line or frame).
        ValueError: the mapping file cannot be read or holds a bad rule (the message names
            the file, the rule and the field), or the dataset has no such partition.
    """
    table = _read_any(path, format, _mapping(mapping), partition)
    return table if native else to_v1(table)


def _read_any(path: str | os.PathLike[str], format: str | None, rules: StageMapping,
              partition: int | None) -> pa.Table:
    if partition is not None:
        return _read_partition(path, format, rules, partition)
    if is_url(path):  # a URL is read as a partitioned dataset, through fsspec
        if format not in (None, "ttft"):
            raise TraceFileError(path, f"a URL is read only as a ttft dataset, not {format!r}")
        return _mapped(rules, read_dataset(path, native=True))
    if os.fspath(path) == STDIN or _is_stream(Path(path)):
        with _spooled(path) as (shown, copy):
            try:
                table = _read(copy, format, rules)
            except TraceFileError as exc:
                raise TraceFileError(shown, exc.reason, row=exc.row, field=exc.field) from None
        return with_run_metadata(table, {**run_metadata(table), "source": shown})
    return _read(Path(path), format, rules)


def _mapped(rules: StageMapping, table: pa.Table) -> pa.Table:
    """``rules`` applied to ``table``: the stage mapping works on ids as text, so a table
    whose ids are bytes is converted first where some rule may act on it. An inert table
    (``StageMapping.inert``, what ``apply`` would return unchanged) is returned as it is,
    so the test is made once: at 23.8M spans it costs about 0.3 s."""
    if rules.inert(table):
        return table
    if is_v2(table.schema):
        table = to_v1(table)
    return rules.apply(table)


def _read_partition(path: str | os.PathLike[str], format: str | None, rules: StageMapping,
                    k: int) -> pa.Table:
    if format not in (None, "ttft"):
        raise TraceFileError(path, f"a partition is read only from a ttft dataset, not {format!r}")
    if not is_dataset(path):
        raise TraceFileError(path, "not a partitioned dataset, so it has no partitions; make "
                                   f"one with: ttft partition {os.fspath(path)} -o DATASET")
    table, own = read_partition(path, k, native=True)
    table = _mapped(rules, table)
    return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                          OWN_ROWS_KEY: str(own).encode()})


def _read(path: Path, format: str | None, rules: StageMapping) -> pa.Table:
    if format is None:
        format = guess_format(path)
    elif format not in IMPORTERS:
        raise TraceFileError(path, f"unknown format {format!r}; known: {', '.join(IMPORTERS)}")
    elif not _exists(path):
        raise TraceFileError(path, "does not exist")
    return _mapped(rules, IMPORTERS[format].read(path))


def _is_stream(path: Path) -> bool:
    """A FIFO or character device: readable once, not seekable, maybe never ending."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def _copy(source: IO[bytes], target: IO[bytes], shown: str) -> None:
    total = 0
    while chunk := source.read(_CHUNK_BYTES):
        total += len(chunk)
        if total > MAX_DECOMPRESSED_BYTES:
            raise TraceFileError(shown, f"more than {MAX_DECOMPRESSED_BYTES} bytes "
                                        "(the limit MAX_DECOMPRESSED_BYTES)")
        target.write(chunk)


def _open_fifo(path: Path) -> IO[bytes]:
    """``path`` opened for reading once a writer has written or closed it; an open that
    would block forever (no writer) waits `FIFO_WAIT_S` and raises `TraceFileError`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        ready, _, _ = select.select([fd], [], [], FIFO_WAIT_S)
        if not ready:
            raise TraceFileError(path, f"no writer opened the FIFO within {FIFO_WAIT_S:g} s")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def _spooled(path: str | os.PathLike[str]) -> Iterator[tuple[str, Path]]:
    """``(name to show, temporary regular file)`` holding the whole stream at ``path``."""
    shown = "<stdin>" if os.fspath(path) == STDIN else os.fspath(path)
    with tempfile.TemporaryDirectory(prefix="ttft-stream-") as folder:
        copy = Path(folder) / "stream"
        try:
            with open(copy, "wb") as target:
                if shown == "<stdin>":
                    if sys.stdin is None or sys.stdin.isatty():
                        raise TraceFileError(shown, "standard input is a terminal; pipe a "
                                                    "trace into it")
                    _copy(sys.stdin.buffer, target, shown)
                elif stat.S_ISFIFO(os.stat(path).st_mode):
                    with _open_fifo(Path(path)) as source:
                        _copy(source, target, shown)
                else:
                    with open(path, "rb") as source:
                        _copy(source, target, shown)
        except OSError as exc:
            raise TraceFileError(shown, f"cannot read ({exc.strerror or exc})") from None
        yield shown, copy
