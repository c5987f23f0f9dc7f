"""Run metadata of several runs or inputs read as one trace: the defects each run counted
(spans an importer or a collector rejected, intervals a source estimated, events an
importer skipped) are summed over all of them, so no run's counts stand for all."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

COUNTED = ("rejected", "estimated")
"""Defects counted in run metadata as ``{"count", "examples"}`` (``analysis.quality``)."""
SKIPPED = "skipped_events"
"""Events an importer skipped, ``{event: count}``."""
EXAMPLES = 10
"""Examples kept per counted defect: the smallest distinct ones."""


def smallest_examples(groups: Iterable[Iterable[Any]]) -> list[str]:
    """The smallest `EXAMPLES` distinct examples (as text) of ``groups``: the same whatever
    the order they came in, or the runs and receivers they came from."""
    return sorted({str(e) for group in groups for e in group})[:EXAMPLES]


def counted_sums(runs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The `COUNTED` defects and `SKIPPED` events of ``runs`` summed (only the keys some run
    has); a count that is not a non-negative integer is left out, as the analysis would
    ignore it."""
    runs = list(runs)
    out: dict[str, Any] = {}
    for key in COUNTED:
        found = [r[key] for r in runs if isinstance(r.get(key), Mapping)
                 and _is_count(r[key].get("count"))]
        if found:
            examples = smallest_examples(f["examples"] for f in found
                                         if isinstance(f.get("examples"), list))
            out[key] = {"count": sum(f["count"] for f in found), "examples": examples}
    skipped: dict[str, int] = {}
    for r in runs:
        events = r.get(SKIPPED)
        for event, count in (events.items() if isinstance(events, Mapping) else ()):
            if _is_count(count):
                skipped[event] = skipped.get(event, 0) + count
    if skipped:
        out[SKIPPED] = dict(sorted(skipped.items()))
    return out


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
