"""The live progress line of a traced run (``ttft trace``, ``ttft demo``)."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RunDisplay:
    """The live progress line: sent, completed, errors, running TTFT p50/p99."""

    def __init__(self, console: Console) -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.fields[stats]}"))
        self.console = console
        self.progress = Progress(*columns, console=console, transient=False)
        self.task = self.progress.add_task("starting", total=None, stats="")
        self.sent = self.errors = 0
        self.ttfts: list[float] = []

    def __enter__(self) -> RunDisplay:
        return self  # the bar appears when the load starts

    def __exit__(self, *exc_info: object) -> None:
        self.progress.stop()

    def callbacks(self) -> dict[str, Callable[..., None]]:
        """The keyword arguments :func:`ttft.collectors.trace_server` takes."""
        return {"on_start": self.start, "on_sent": self.on_sent,
                "on_result": self.on_result, "on_waiting": self.waiting}

    def start(self, total: int, receiver: str) -> None:
        self.console.print(f"receiving the server's spans on {receiver} (OTLP/HTTP)")
        self.progress.update(self.task, total=total, description="requests")
        self.progress.start()

    def on_sent(self, index: int) -> None:
        self.sent += 1
        self._refresh(advance=0)

    def on_result(self, result) -> None:
        if result.error:
            self.errors += 1
        elif result.ttft_s is not None:
            bisect.insort(self.ttfts, result.ttft_s * 1000)
        self._refresh(advance=1)

    def waiting(self) -> None:
        self.progress.update(self.task, description="waiting for the server's spans")

    def _refresh(self, advance: int) -> None:
        stats = f"sent {self.sent}  errors {self.errors}"
        if self.ttfts:
            n = len(self.ttfts)
            p50, p99 = self.ttfts[(n - 1) // 2], self.ttfts[min(n - 1, int(0.99 * n))]
            stats += f"  TTFT p50 {p50:,.1f} ms  p99 {p99:,.1f} ms"
        self.progress.update(self.task, advance=advance, stats=stats)
