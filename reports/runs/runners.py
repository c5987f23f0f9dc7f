"""Where a driver's steps run (docs/architecture.md, "One program"): `InProcess`, here on
the whole trace, or `OnDask`, one task per partition of a dataset on a Dask cluster, local
(`local_cluster`) or one a user started (`runner`). ``reports.runs.analyses`` is the
driver that uses them.

Dask (``distributed``) is the ``dask`` extra: ``pip install 'ttft[dask]'``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Union

from ttft.collectors.location import TraceLocation
from ttft.reports import arrow_pool

__all__ = ["INSTALL_HINT", "WORKER_ENVIRON", "DaskMissing", "InProcess", "OnDask", "Piece",
           "Runner", "local_cluster", "runner"]

INSTALL_HINT = "pip install 'ttft[dask]'"
Piece = int | None
"""A partition of a dataset, or None: the whole trace."""


class DaskMissing(ImportError):
    """``distributed`` is not installed; the message says how to install it."""


class InProcess:
    """Every step here, on the whole trace (a dataset read whole: every partition's own
    rows), the table read once and its assembly kept for the waterfalls.

    A runner has ``pieces(location)`` (what a location is analysed in: None, the whole
    trace, or partition numbers), ``map(task, location, pieces, *args, each=, on_done=)``
    (``task(location, piece, *args, *each[piece])`` for every piece, results in order,
    ``on_done`` after each; with ``sink``, ``sink(piece, result)`` as each comes instead,
    none kept) and ``share(value)`` (a value as every task receives it)."""

    workers = 1
    keeps = True

    def pieces(self, location: TraceLocation) -> list[Piece]:
        return [None]

    def map(self, task: Callable[..., Any], location: TraceLocation, pieces: Sequence[Piece],
            *args: Any, each: Mapping[Piece, tuple[Any, ...]] | None = None,
            on_done: Callable[[], None] | None = None,
            sink: Callable[[Piece, Any], None] | None = None) -> list[Any]:
        out = []
        for piece in pieces:
            result = task(location, piece, *args, *(each or {}).get(piece, ()))
            if sink is None:
                out.append(result)
            else:
                sink(piece, result)
            if on_done is not None:
                on_done()
        return out

    def share(self, value: Any) -> Any:
        return value


Runner = Union["InProcess", "OnDask"]
"""Where the steps run."""


class OnDask:
    """One Dask task per partition of a dataset, each result fetched as its task ends and
    its future released at once, so a worker holds what it is computing, never every
    partition's result."""

    keeps = False

    def __init__(self, client: Any) -> None:
        self.client = client

    @property
    def workers(self) -> int:
        return len(self.client.scheduler_info().get("workers", {}))

    def pieces(self, location: TraceLocation) -> list[Piece]:
        return list(range(location.partitions()))

    def map(self, task: Callable[..., Any], location: TraceLocation, pieces: Sequence[Piece],
            *args: Any, each: Mapping[Piece, tuple[Any, ...]] | None = None,
            on_done: Callable[[], None] | None = None,
            sink: Callable[[Piece, Any], None] | None = None) -> list[Any]:
        from distributed import as_completed

        futures = {self.client.submit(task, location, k, *args, *(each or {}).get(k, ()),
                                      pure=False): k for k in pieces}
        results: dict[Piece, Any] = {}
        for future in as_completed(list(futures)):
            k = futures.pop(future)
            result = future.result()
            future.release()
            if sink is None:
                results[k] = result
            else:
                sink(k, result)
            del result
            if on_done is not None:
                on_done()
        return [results[k] for k in pieces] if sink is None else []

    def share(self, value: Any) -> Any:
        return self.client.scatter(value, broadcast=True)


@contextmanager
def runner(workers: int | None = None, scheduler: str | None = None) -> Iterator[Runner]:
    """`InProcess` without ``workers`` and ``scheduler``; else `OnDask` on a
    ``LocalCluster`` of ``workers`` processes (one thread each, on 127.0.0.1; its status
    server on a free port, never a fixed one another process may hold), or connected to
    the scheduler at ``scheduler``.

    Raises:
        DaskMissing: ``distributed`` is not installed.
        OSError: the scheduler cannot be reached (within 30 s).
    """
    if workers is None and scheduler is None:
        yield InProcess()
        return
    try:
        from distributed import Client
    except ImportError as exc:
        raise DaskMissing(f"--workers and --scheduler need Dask: {INSTALL_HINT}") from exc
    if scheduler is not None:
        with Client(scheduler, timeout="30s") as client:
            yield OnDask(client)
        return
    with local_cluster(workers or 1, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as client:
        yield OnDask(client)


WORKER_ENVIRON = {"MALLOC_TRIM_THRESHOLD_": None}
"""What the workers of a local cluster get in place of the Dask nanny's defaults
(``distributed.nanny.pre-spawn-environ``; None: unset). Dask sets
``MALLOC_TRIM_THRESHOLD_=65536``, and glibc, given any trim threshold, stops raising its
mmap threshold, so every array over 128 KiB is mapped afresh and faulted in page by page:
a partition's analysis took 1.6× as long (docs/architecture.md, "Workers' memory")."""


def local_cluster(workers: int, **options: Any) -> Any:
    """A Dask ``LocalCluster`` of ``workers`` one-thread processes on 127.0.0.1, their
    environment as `WORKER_ENVIRON` says; ``options`` go to ``LocalCluster``.

    A nanny writes its pre-spawn environment into this process's own ``os.environ``
    before it spawns, so any cluster started here before (with Dask's defaults) would
    hand ``MALLOC_TRIM_THRESHOLD_`` on to these workers: what `WORKER_ENVIRON` unsets is
    out of ``os.environ`` while they start, and put back after. So is the Arrow pool a
    command chose for its own process (``reports.arrow_pool``): a worker keeps Arrow's
    default, which it reuses better."""
    import dask
    from distributed import LocalCluster

    wanted = dict(WORKER_ENVIRON)
    if arrow_pool.chosen_here():
        wanted[arrow_pool.VARIABLE] = None
    environ = {f"distributed.nanny.pre-spawn-environ.{name}": value
               for name, value in wanted.items()}
    held = {name: os.environ.pop(name) for name, value in wanted.items()
            if value is None and name in os.environ}
    try:
        with dask.config.set(environ):  # the nannies read it as they are made
            return LocalCluster(**{"n_workers": workers, "threads_per_worker": 1,
                                   "processes": True, "host": "127.0.0.1",
                                   "silence_logs": 40, **options})
    finally:
        os.environ.update(held)
