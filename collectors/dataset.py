"""Partitioned trace datasets: one trace split into partitions that each keep their
requests whole, so one task can analyse one partition (issue 17, docs/design.md "The span
record").

The layout, hive-style::

    DATASET/
      _ttft_dataset.json       {"format": "ttft-dataset", "version": 1, "partitions": N,
                                "key": "<the partition rule in words>",
                                "schema_version": <SCHEMA_VERSION>, "spans": <own rows>,
                                "copies": <borrowed rows>, "metadata": {<run metadata>}}
      part=0/spans.parquet     the rows partition 0 owns: every row of the input is owned by
                               exactly one partition
      part=0/borrowed.parquet  rows copied in from other partitions (the engine step traces
                               a request of this partition ran in); absent when there are none
      part=1/...

Each partition file names its dataset (the dataset file's ``id``) and partition under
`PARTITION_KEY`; `checked_dataset` holds a dataset to its dataset file before any
partition is read (``read_dataset``, and a cluster's driver).

Every ``part=K/`` directory exists, with a ``spans.parquet`` (empty when the partition owns
no row). The Parquet files are ttft traces (``collectors/layout.py``: run metadata under
``METADATA_KEY``, ``WRITE_OPTIONS``), each written under a temporary name and renamed.
Partition 0's files alone carry the input's counts (`tracer.schema.COUNTED`: the importer's
``rejected`` and ``estimated`` spans), so sums over partitions equal the whole. The
``_ttft_dataset.json`` is written last, the same way, so a dataset whose writing stopped
half way is never read as one: ``part=K/`` directories without it are refused.
``DATASET/_incoming/`` (`STAGING_DIR`), when present, is the staging of ``ttft collect
--partitions`` (a collect directory of runs, ``collectors/staging.py``) that readers never
read: beside a dataset file it is spans not yet partitioned in; without one, reading names
the command that finishes it.

``DATASET`` may be a local path or a URL with a protocol (``s3://``, ``memory://``,
``file://``), read and written through `fsspec` and the filesystem package for the protocol
(e.g. ``s3fs``), which the user installs; local paths never need fsspec.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ttft.collectors.errors import TraceFileError
from ttft.collectors.parquet import read_parquet
from ttft.tracer.schema import SCHEMA_VERSION
from ttft.tracer.span_ids import same_layout, to_v1

__all__ = [
    "DATASET_FILE",
    "PARTITION_KEY",
    "STAGING_DIR",
    "checked_dataset",
    "dataset_info",
    "is_dataset",
    "is_url",
    "iter_partitions",
    "looks_like_dataset",
    "read_dataset",
    "read_partition",
]

DATASET_FILE = "_ttft_dataset.json"
"""The dataset metadata file, written last: a directory without it is no dataset."""
STAGING_DIR = "_incoming"

FORMAT, VERSION = "ttft-dataset", 1
SPANS_FILE, BORROWED_FILE = "spans.parquet", "borrowed.parquet"
PARTITION_KEY = b"ttft.partition"
"""Schema metadata of a partition's files: ``{"dataset": <id>, "partition": K,
"partitions": N, "file": <name>}``, checked against where the file lies."""
_PART_PREFIX = "part="
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str | os.PathLike[str]) -> bool:
    """``path`` is a string with a protocol (``s3://...``): read and written through fsspec."""
    return isinstance(path, str) and bool(_URL_RE.match(path))


def _partition_name(k: int) -> str:
    return f"{_PART_PREFIX}{k}"


def _filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path within it.

    Raises:
        TraceFileError: fsspec, or the filesystem package for the protocol, is missing.
    """
    try:
        from fsspec.core import url_to_fs

        return url_to_fs(url)
    except ImportError as exc:
        protocol = url.split("://", 1)[0]
        extra = {"s3": " s3fs", "gs": " gcsfs", "gcs": " gcsfs", "az": " adlfs",
                 "abfs": " adlfs"}.get(protocol, "")
        raise TraceFileError(url, f"a {protocol}:// path needs fsspec and the package of its "
                                  f"filesystem: pip install fsspec{extra} ({exc})") from None


# --- reading -------------------------------------------------------------------------------


def is_dataset(path: str | os.PathLike[str]) -> bool:
    """``path`` is a dataset directory (it holds ``_ttft_dataset.json``; not checked here)."""
    if is_url(path):
        fs, root = _filesystem(os.fspath(path))
        return bool(fs.isfile(f"{root}/{DATASET_FILE}"))
    return (Path(path) / DATASET_FILE).is_file()


def looks_like_dataset(path: str | os.PathLike[str]) -> bool:
    """``path`` is a dataset, or a local directory holding ``part=K/`` directories (a dataset
    whose writing did not finish, which :func:`read_dataset` refuses)."""
    if is_dataset(path):
        return True
    if is_url(path) or not Path(path).is_dir():
        return False
    return any((child.name.startswith(_PART_PREFIX) or child.name == STAGING_DIR)
               and child.is_dir()
               for child in Path(path).iterdir())


def _read_bytes(path: str | os.PathLike[str], name: str) -> bytes | None:
    """The bytes of ``path/name``; None when there is no such file."""
    try:
        if is_url(path):
            fs, root = _filesystem(os.fspath(path))
            return bytes(fs.cat_file(f"{root}/{name}"))
        return (Path(path) / name).read_bytes()
    except FileNotFoundError:
        return None


def _shown(path: str | os.PathLike[str], name: str) -> str:
    return f"{os.fspath(path).rstrip('/')}/{name}"


def dataset_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The contents of a dataset's ``_ttft_dataset.json``, checked.

    Raises:
        TraceFileError: the file is missing (a dataset not completely written), not JSON,
            not a ttft dataset, of a newer version or schema, or its partition count is not
            a positive integer; the message names the file.
    """
    shown = _shown(path, DATASET_FILE)
    raw = _read_bytes(path, DATASET_FILE)
    if raw is None and _exists(path, STAGING_DIR):
        raise TraceFileError(path, f"an unfinished ttft collect --partitions (spans staged in "
                                   f"{STAGING_DIR}/): finish it with ttft collect -o {path} "
                                   f"--partitions N (stop it at once), or read them with ttft "
                                   f"partition {_shown(path, STAGING_DIR)} -o OTHER")
    if raw is None:
        raise TraceFileError(shown, "missing: not a partitioned dataset, or one whose writing "
                                    "did not finish (this file is written last); write it "
                                    "again")
    try:
        info = json.loads(raw)
    except ValueError as exc:
        raise TraceFileError(shown, f"not valid JSON ({exc})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise TraceFileError(shown, f"not a ttft dataset file (no \"format\": \"{FORMAT}\")")
    for field, newest in (("version", VERSION), ("schema_version", SCHEMA_VERSION)):
        value = info.get(field)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TraceFileError(shown, f"no integer {field}")
        if value > newest:
            raise TraceFileError(shown, f"{field} {value} is newer than this ttft supports "
                                        f"({newest}); upgrade ttft")
    partitions = info.get("partitions")
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise TraceFileError(shown, f"partitions must be a positive integer, not "
                                    f"{partitions!r}")
    return info


def _exists(path: str | os.PathLike[str], name: str) -> bool:
    if is_url(path):
        fs, root = _filesystem(os.fspath(path))
        return bool(fs.exists(f"{root}/{name}"))
    return (Path(path) / name).exists()


def _read_file(path: str | os.PathLike[str], name: str) -> pa.Table:
    """The checked ttft trace ``path/name`` (downloaded first for a URL)."""
    if not is_url(path):
        return read_parquet(Path(path) / name)
    fs, root = _filesystem(os.fspath(path))
    with tempfile.TemporaryDirectory(prefix="ttft-dataset-") as scratch:
        local = Path(scratch) / Path(name).name
        try:
            fs.get_file(f"{root}/{name}", str(local))
        except FileNotFoundError:
            raise TraceFileError(_shown(path, name), "does not exist") from None
        try:
            return read_parquet(local)
        except TraceFileError as exc:
            raise TraceFileError(_shown(path, name), exc.reason, row=exc.row,
                                 field=exc.field) from None


def _partition_index(info: Mapping[str, Any], path: str | os.PathLike[str], k: int) -> str:
    if not 0 <= k < info["partitions"]:
        raise ValueError(f"{path}: no partition {k} (the dataset has {info['partitions']})")
    return _partition_name(k)


def read_partition(path: str | os.PathLike[str], k: int, *, native: bool = False
                   ) -> tuple[pa.Table, int]:
    """Partition ``k`` of the dataset at ``path``: its own rows followed by its borrowed
    rows, and the number of own rows.

    Returns:
        A table with exactly ``SPAN_SCHEMA`` (with ``native``, ``SPAN_SCHEMA_V2`` where the
        files hold the ids as bytes: ``read_spans``' ``native``) whose schema metadata is
        the run metadata of the partition's ``spans.parquet``, and the count of its own
        (leading) rows.

    Raises:
        TraceFileError: the dataset file or a partition's file is missing or unreadable.
        ValueError: no partition ``k``.
    """
    folder = _partition_index(dataset_info(path), path, k)
    own = _read_file(path, f"{folder}/{SPANS_FILE}")
    count = own.num_rows
    if _exists(path, f"{folder}/{BORROWED_FILE}"):
        borrowed = _read_file(path, f"{folder}/{BORROWED_FILE}")
        own = pa.concat_tables(same_layout(
            [own, borrowed.replace_schema_metadata(own.schema.metadata)]))
    return (own if native else to_v1(own)), count


def _check_identity(info: Mapping[str, Any], path: str | os.PathLike[str], k: int,
                    name: str, schema: pa.Schema) -> None:
    """Refuse a partition file that says it belongs to another dataset or partition (one
    copied over another); a dataset written before files said so is not checked."""
    raw = (schema.metadata or {}).get(PARTITION_KEY)
    if "id" not in info or raw is None:
        return
    said = json.loads(raw)
    want = {"dataset": info["id"], "partition": k, "partitions": info["partitions"],
            "file": name}
    if said != want:
        where = f"partition {said.get('partition')} of dataset {said.get('dataset')}"
        raise TraceFileError(_shown(path, f"{_partition_name(k)}/{name}"),
                             f"belongs to {where}, not here (partition {k} of {info['id']}): "
                             "the dataset was changed after it was written; write it again")


def _footer(path: str | os.PathLike[str], name: str) -> tuple[int, pa.Schema] | None:
    """``(rows, schema)`` from the Parquet footer of ``path/name``; None when absent."""
    try:
        if is_url(path):
            fs, root = _filesystem(os.fspath(path))
            with fs.open(f"{root}/{name}", "rb") as handle:
                meta = pq.read_metadata(handle)
        else:
            meta = pq.read_metadata(Path(path) / name)
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException) as exc:
        raise TraceFileError(_shown(path, name), f"not a readable Parquet file ({exc})") from None
    return meta.num_rows, meta.schema.to_arrow_schema()


def checked_dataset(path: str | os.PathLike[str]) -> dict[str, Any]:
    """`dataset_info`, with the dataset checked against it before any partition is read:
    exactly ``part=0`` … ``part=N-1``, their own and borrowed rows summing to its
    ``spans`` and ``copies``, each file in its own place (`PARTITION_KEY`). One process and
    a cluster's driver both call this, so a changed dataset gives one error either way.

    Raises:
        TraceFileError: as `dataset_info`, or the dataset does not match it (the message
            says how).
    """
    info = dataset_info(path)
    n = int(info["partitions"])
    found = sorted(_partition_dirs(path))
    if len(found) != n or (found and found[-1] != n - 1):  # never a list of N: N may be huge
        extra = [k for k in found if k >= n]
        have = set(found)
        missing = [k for k in range(min(n, len(found) + 3)) if k not in have][:3]
        what = (f"holds part={extra[0]} beyond" if extra else
                f"lacks part={', part='.join(map(str, missing))} of")
        raise TraceFileError(path, f"{what} the {n} partitions its {DATASET_FILE} says: "
                                   "changed after it was written; write it again")
    counts = {"spans": 0, "copies": 0}
    for k in range(n):
        for name, key in ((SPANS_FILE, "spans"), (BORROWED_FILE, "copies")):
            footer = _footer(path, f"{_partition_name(k)}/{name}")
            if footer is None and name == SPANS_FILE:
                raise TraceFileError(_shown(path, f"{_partition_name(k)}/{name}"),
                                     "does not exist; write the dataset again")
            if footer is not None:
                counts[key] += footer[0]
                _check_identity(info, path, k, name, footer[1])
    for key, got in counts.items():
        if key in info and got != info[key]:
            raise TraceFileError(path, f"its partitions hold {got:,} {key}, its {DATASET_FILE} "
                                       f"says {info[key]:,}: changed after it was written "
                                       "(a file removed or replaced); write it again")
    return info


def _partition_dirs(path: str | os.PathLike[str]) -> list[int]:
    """The K of every ``part=K`` directory of the dataset."""
    if is_url(path):
        fs, root = _filesystem(os.fspath(path))
        names = [entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(root, detail=False)]
    else:
        names = [child.name for child in Path(path).iterdir() if child.is_dir()]
    return [int(name[len(_PART_PREFIX):]) for name in names
            if name.startswith(_PART_PREFIX) and name[len(_PART_PREFIX):].isdigit()]


def read_dataset(path: str | os.PathLike[str], *, native: bool = False) -> pa.Table:
    """Every partition's own rows, in partition order (the input's rows, each once), with
    partition 0's run metadata; :func:`ttft.collectors.read_spans` reads a dataset so
    (``native``: as `read_partition`'s).

    Raises:
        TraceFileError: as :func:`checked_dataset` and :func:`read_partition`.
    """
    tables = list(iter_partitions(path, native=True))
    table = pa.concat_tables(same_layout(tables)).replace_schema_metadata(
        tables[0].schema.metadata)
    return table if native else to_v1(table)


def iter_partitions(path: str | os.PathLike[str], *, native: bool = False
                    ) -> Iterator[pa.Table]:
    """Each partition's own rows in partition order, one partition read at a time
    (`read_dataset` is all of them as one table), each with its file's run metadata
    (``native``: as `read_partition`'s).

    Raises:
        TraceFileError: as :func:`checked_dataset` and :func:`read_partition`.
    """
    info = checked_dataset(path)
    for k in range(info["partitions"]):
        table = _read_file(path, f"{_partition_name(k)}/{SPANS_FILE}")
        yield table if native else to_v1(table)
