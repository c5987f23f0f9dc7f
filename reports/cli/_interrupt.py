"""What a traced run stopped by Ctrl-C or SIGTERM kept: the line ``ttft trace`` prints
before it exits with code 130."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ttft.tracer.schema import OUTCOME_OK

_Identity = tuple[int, int, int, int]


def _identity(path: Path) -> _Identity | None:
    """The file at ``path`` (device, inode, mtime, size), None when there is none: the trace
    writer replaces the file by a rename, so a written trace never has the identity the
    path had before."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


class RunTally:
    """Counts a traced run's requests from the callbacks of
    :func:`ttft.collectors.trace_server`, passing each call on to the ones it wraps (the
    progress display's): the requests of the workload (``on_start``), those sent and those
    that ended. A request sent that never ended was in flight at the stop, and the load
    generator ended it ``cancelled`` (it passes those to no ``on_result``). Called on the
    load's thread; made before the run, so it knows whether the trace file is new."""

    def __init__(self, callbacks: dict[str, Callable[..., None]], out: Path) -> None:
        self._inner = callbacks
        self.out = out
        self._before = _identity(out)
        self.total: int | None = None  # None until the load starts
        self.sent = self.ended = self.failed = 0

    def callbacks(self) -> dict[str, Callable[..., None]]:
        """The keyword arguments for ``trace_server``: the wrapped ones, counted."""
        return {**self._inner, "on_start": self._start, "on_sent": self._sent,
                "on_result": self._result}

    def _start(self, total: int, receiver: str) -> None:
        self.total = total
        if start := self._inner.get("on_start"):
            start(total, receiver)

    def _sent(self, index: int) -> None:
        self.sent += 1
        if sent := self._inner.get("on_sent"):
            sent(index)

    def _result(self, result) -> None:
        self.ended += 1
        self.failed += result.outcome != OUTCOME_OK
        if ended := self._inner.get("on_result"):
            ended(result)

    def interrupted_line(self) -> str:
        """What the stopped run kept, e.g. ``interrupted: 12 requests done (0 failed), 3 in
        flight cancelled, 35 not sent; trace written to run.parquet (1,204 span rows)``."""
        if self.total is None:
            head = "interrupted before the load started"
        else:
            head = (f"interrupted: {self.ended} request{'' if self.ended == 1 else 's'} "
                    f"done ({self.failed} failed), "
                    f"{self.sent - self.ended} in flight cancelled, "
                    f"{self.total - self.sent} not sent")
        now = _identity(self.out)
        if now is None or now == self._before:
            kept = f"{self.out} left as it was" if now is not None else "no trace written"
            return f"{head}; {kept}"
        return f"{head}; trace written to {self.out}{_rows(self.out)}"


def _rows(path: Path) -> str:
    """`` (N span rows)`` from the file's footer, or nothing when it cannot be read."""
    import pyarrow.parquet as pq

    try:
        return f" ({pq.read_metadata(path).num_rows:,} span rows)"
    except (OSError, ValueError):
        return ""
