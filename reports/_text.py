"""Strings from paths, files and the network printed as what they are: plain text.

Rich reads ``[...]`` in a string as markup (a ``[/]`` raises ``MarkupError``) and passes
escape sequences through to the terminal. Every string a renderer did not write itself goes
through :func:`plain` (or :func:`safe` where a ``str`` is needed); the CLI's consoles are
:class:`PlainConsole`, which prints every ``str`` this way too, so a string that slips
past a renderer is still shown, never interpreted.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.style import StyleType
from rich.text import Text

from ttft.tracer.schema import CLIENT_CLOCK

__all__ = ["PlainConsole", "labelled", "plain", "safe"]

# C0 controls, DEL, C1 controls, and the line separators and bidirectional overrides that
# reorder or break what a terminal shows.
_OTHERS = "\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[\x00-\x1f{_OTHERS}]")
_CONTROL_KEEP_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f{_OTHERS}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe(value: object, *, keep_newlines: bool = False) -> str:
    """``str(value)`` with every control character escaped visibly: ESC as ``\\x1b``, a
    newline as ``\\n`` (kept as a line break with ``keep_newlines``), DEL as ``\\x7f``,
    U+202E as ``\\u202e``. Brackets are left as they are: the result is text, to be put in
    a :class:`~rich.text.Text` or printed by a console with markup off, never parsed."""
    pattern = _CONTROL_KEEP_NEWLINE if keep_newlines else _CONTROL
    return pattern.sub(_escape, str(value))


def plain(value: object, style: StyleType = "") -> Text:
    """``value`` as a :class:`~rich.text.Text` of :func:`safe` text in ``style``: a table
    cell, a title or a part of a line that rich shows exactly as written."""
    return Text(safe(value), style=style)


def labelled(label: str, style: StyleType, message: object) -> Text:
    """``label`` in ``style``, a space, then ``message`` as :func:`plain` text: the
    ``error: ...`` and ``note: ...`` lines."""
    return Text.assemble((label, style), " ", plain(message))


class PlainConsole(Console):
    """A :class:`~rich.console.Console` that prints every ``str`` (in ``print``, table
    cells, titles and captions) as plain text: no markup, no emoji codes, control
    characters escaped as :func:`safe` does, line breaks kept. Styled output is built
    from :class:`~rich.text.Text`, which this console shows as it is."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs.update(markup=False, emoji=False)
        return super().render_str(safe(text, keep_newlines=True), **kwargs)


def spread_words(c: dict[str, Any]) -> str:
    """What a pair's ``spread_ms`` (``analysis.summary.clock_list``) measures, in words: a
    server pair's is the interquartile range of its requests' estimates; a worker pair's
    the width of the offsets its requests all fit (but the outer few), negative when none
    fits them all, which is said as such instead of as a negative spread, and 0 when no
    request bounds it above, which is said as such instead of as an exact offset."""
    if c["client_clock"] == CLIENT_CLOCK:
        return f"spread {c['spread_ms']:,.3f} ms"
    if not c.get("bounded", True):
        return "range open above (no request's first byte bounds it)"
    if c["spread_ms"] < 0:
        return f"no offset fits every request (bounds cross by {-c['spread_ms']:,.3f} ms)"
    return f"range {c['spread_ms']:,.3f} ms wide"


def moved_in_all(clocks: list[dict[str, Any]], c: dict[str, Any]) -> str:
    """For a worker pair ``c`` of ``clocks`` (``analysis.summary.clock_list``) whose server
    clock moves, how far its rows move (that offset, then its own): ``; with S's, its rows
    move ±X ms``; else ``""``."""
    server = next((s["offset_ms"] for s in clocks if s["client_clock"] == CLIENT_CLOCK
                   and s["server_clock"] == c["client_clock"]), 0.0)
    if c["client_clock"] == CLIENT_CLOCK or not server:
        return ""
    return f"; with {c['client_clock']}'s, its rows move {server + c['offset_ms']:+,.3f} ms"


UNTRACED_NOTE = (
    "untraced: time of requests the server sent no span for, its own and the network's "
    "together. To split it, point the server's OTLP exporter at ttft's receiver "
    "(ttft trace listens on http://127.0.0.1:4318/v1/traces)."
)
"""The one line the terminal and the HTML report print under a table with ``untraced`` time."""
