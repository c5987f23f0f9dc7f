"""The staging and the swap of ``ttft collect --partitions``: spans are received into
``DATASET/_incoming/`` (`STAGING_DIR`, a ``ttft collect`` directory of runs, durable as
any), and at the stop a new dataset, the dataset's own rows and the staged ones partitioned
again, is written beside ``DATASET`` and swapped in with one atomic rename
(``collectors/dataset.py`` has the layout).

The swap is the one commit point: while ``DATASET/_incoming/`` exists its spans are not in
the dataset's partitions yet, and the dataset swapped in has no ``_incoming/``, so a crash at
any moment either leaves the staging to partition again or has already put it in, never
both. The siblings, in ``DATASET``'s parent directory:

- ``.NAME.ttft-next/``: the dataset being written (after the swap: the replaced one);
- ``.NAME.ttft-prev/``: the replaced dataset, where the filesystem cannot exchange two
  directories atomically and the swap is two renames;
- ``.NAME.ttft-lock``: held (``flock``) by the one collect writing ``DATASET``; kept.

:func:`recover` puts a swap a crash interrupted right, and removes the siblings.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ttft.collectors.dataset import DATASET_FILE, STAGING_DIR
from ttft.collectors.errors import TraceFileError
from ttft.collectors.layout import fsync

__all__ = ["STAGING_DIR", "holding", "next_path", "recover", "staging_path", "swap_in"]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_NO_EXCHANGE = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


def staging_path(dataset: Path) -> Path:
    """Where ``ttft collect --partitions`` receives the spans of ``dataset``."""
    return dataset / STAGING_DIR


def _sibling(dataset: Path, suffix: str) -> Path:
    dataset = dataset.absolute()
    return dataset.with_name(f".{dataset.name}.ttft-{suffix}")


def next_path(dataset: Path) -> Path:
    """The directory the next version of ``dataset`` is written in (absent: :func:`recover`
    removes it)."""
    return _sibling(dataset, "next")


@contextmanager
def holding(dataset: Path) -> Iterator[None]:
    """Hold ``dataset``'s lock for the block: one collect writes a dataset at a time.

    Raises:
        TraceFileError: another process holds it.
        OSError: the lock file cannot be created.
    """
    lock = _sibling(dataset, "lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TraceFileError(dataset, "another ttft collect is writing this dataset "
                                          f"(it holds {lock})") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _exchange(a: Path, b: Path) -> bool:
    """Swap directories ``a`` and ``b`` in one step (Linux ``renameat2``); False where the
    system or the filesystem cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(a))


def swap_in(dataset: Path) -> None:
    """Make the complete dataset at :func:`next_path` ``dataset``, atomically where the
    filesystem can exchange directories (else two renames that :func:`recover` completes
    after a crash), and remove the replaced one (its staging with it).

    Raises:
        OSError: a rename fails.
    """
    new, prev = next_path(dataset), _sibling(dataset, "prev")
    fsync(new)
    if dataset.exists() and not _exchange(new, dataset):
        os.rename(dataset, prev)
        os.rename(new, dataset)
    elif not dataset.exists():
        os.rename(new, dataset)
    fsync(dataset.absolute().parent)
    for leftover in (new, prev):
        shutil.rmtree(leftover, ignore_errors=True)


def recover(dataset: Path) -> None:
    """Finish or undo a swap a crash interrupted, and remove the siblings it left; call
    while :func:`holding` the dataset, before writing to it.

    Raises:
        OSError: a rename fails.
    """
    new, prev = next_path(dataset), _sibling(dataset, "prev")
    if not dataset.exists() and prev.exists():  # between the two renames of a swap
        os.rename(new if (new / DATASET_FILE).is_file() else prev, dataset)
        fsync(dataset.absolute().parent)
    for leftover in (new, prev):
        shutil.rmtree(leftover, ignore_errors=True)
