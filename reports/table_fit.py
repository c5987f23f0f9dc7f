"""Tables fitted to the width they are drawn in: every column at least as wide as its
widest number and its longest word, so nothing is cut; columns dropped, or headers
shortened, in a stated order where even that is too wide."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Column, Table

__all__ = ["FittedTable", "allot", "fit"]


def _span(console: Console, cells: Sequence[object]) -> tuple[int, int]:
    """The longest word and the longest line among ``cells``."""
    options = console.options.update_width(10_000)
    found = [Measurement.get(console, options, cell) for cell in cells]
    return max(m.minimum for m in found), max(m.maximum for m in found)


def allot(table: Table, console: Console, width: int | None = None) -> bool:
    """Fix the width of every column of ``table`` so that it is drawn in at most ``width``
    (default ``console.width``) columns with nothing cut; whether it could be.

    A right-justified (number) or ``no_wrap`` column is never narrower than its widest
    cell, so a number is never cut or wrapped; a text column never narrower than its
    longest word, and wraps at spaces; headers wrap at spaces. Columns get what is left
    over that in proportion to how much more they could use (all of it when there is room:
    the table as rich would draw it). When even the narrowest is too wide the function
    returns False, the table as narrow as it goes."""
    spans: list[tuple[Column, int, int]] = []
    for column in table.columns:
        head_low, head_high = _span(console, [column.header])
        cells = list(column.cells)
        cells_low, cells_high = _span(console, cells) if cells else (1, 1)
        if column.justify == "right" or column.no_wrap:
            cells_low = cells_high
        low = max(head_low, cells_low)
        spans.append((column, low, max(low, head_high, cells_high)))
        column.width = low
    wide = console.options.update_width(10_000)
    slack = (width or console.width) - Measurement.get(console, wide, table).maximum
    wanted = sum(high - low for _, low, high in spans)
    if slack > 0:
        for column, low, high in spans:
            column.width = high if wanted <= slack else low + slack * (high - low) // wanted
    return slack >= 0


def fit(table: Table, console: Console, drop: Sequence[str] = ()) -> Table:
    """``table`` fitted to ``console.width`` (:func:`allot`): the columns whose headers
    ``drop`` names are removed, in that order, while it does not fit."""
    for header in drop:
        if allot(table, console):
            return table
        table.columns = [c for c in table.columns if c.header != header]
    allot(table, console)
    return table


class FittedTable(Table):
    """A :class:`~rich.table.Table` that fits itself (:func:`allot`) to the width it is
    drawn in, for a renderer that returns a table without knowing the console. Where it
    does not fit, the headers that ``short`` names are first shortened to its values."""

    def __init__(self, *args: Any, short: Mapping[str, str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.short = dict(short or {})

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not allot(self, console, options.max_width):
            for column in self.columns:
                if isinstance(column.header, str):
                    column.header = self.short.get(column.header, column.header)
            allot(self, console, options.max_width)
        return super().__rich_console__(console, options)
