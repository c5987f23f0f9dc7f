"""The live progress line of a traced run (``ttft trace``, ``ttft demo``)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column

from ttft.reports._text import plain
from ttft.tracer.schema import OUTCOME_OK


class _BarAndFigures(Progress):
    """A :class:`~rich.progress.Progress` that draws its tasks' bar line, then each task's
    ``stats`` field on a line of its own (folded, never cut, on a narrow console)."""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            if task.fields.get("stats"):
                yield plain(task.fields["stats"])


class RunDisplay:
    """The live progress display, two lines that fit an 80-column terminal: what it is
    doing, a bar, completed of total and the time elapsed; below it the requests sent
    and failed and the running TTFT p50/p99 of the ok requests (client TTFT, the
    percentiles of ``ttft analyze``). The bar narrows (40 to 10 characters) to leave the
    rest of its line whole."""

    def __init__(self, console: Console) -> None:
        bar = BarColumn(bar_width=None, table_column=Column(min_width=10, max_width=40))
        columns = (TextColumn("{task.description}"), bar, MofNCompleteColumn(),
                   TimeElapsedColumn())
        self.console = console
        self.progress = _BarAndFigures(*columns, console=console, transient=False)
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
        self.console.print(plain(f"receiving the server's spans on {receiver} (OTLP/HTTP)"))
        self.progress.update(self.task, total=total, description="requests")
        self.progress.start()

    def on_sent(self, index: int) -> None:
        self.sent += 1
        self._refresh(advance=0)

    def on_result(self, result) -> None:
        if result.outcome != OUTCOME_OK:
            self.errors += 1
        elif result.ttft_s is not None:
            bisect.insort(self.ttfts, result.ttft_s * 1000)
        self._refresh(advance=1)

    def waiting(self) -> None:
        self.progress.update(self.task, description="waiting for the server's spans")

    def ttft_ms(self) -> tuple[float, float] | None:
        """TTFT p50 and p99 of the ok requests so far, in ms: numpy's linear percentiles,
        as ``ttft analyze`` reports them (None before the first)."""
        if not self.ttfts:
            return None
        import numpy as np

        p50, p99 = np.percentile(self.ttfts, (50, 99))
        return float(p50), float(p99)

    def stats(self) -> str:
        """The line's counts and percentiles."""
        out = f"sent {self.sent}  failed {self.errors}"
        ttft = self.ttft_ms()
        if ttft is not None:
            out += f"  ok TTFT p50 {ttft[0]:,.1f} ms  p99 {ttft[1]:,.1f} ms"
        return out

    def _refresh(self, advance: int) -> None:
        self.progress.update(self.task, advance=advance, stats=self.stats())
