"""Interval rules: the time between two events of one span becomes a stage (the mechanics
behind a rule's ``from_event``/``to_event``; `ttft.collectors.importers.mapping` states the
rule). Only the rows of the rule's events, and the spans that carry them, are looked at one
by one: a table without those event names costs one dictionary lookup per rule."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ttft.collectors.importers._mapping_rules import Application, Rule

DERIVE_EVENTS = "events:"
"""``ttft.derived`` of an interval's row: ``events:STAGE:FROM..TO``."""


def pair(starts: list[int], ends: list[int]) -> list[tuple[int, int]]:
    """Each start, in time order, with the first end at or after it that no earlier start
    took; a start no end is left for places nothing."""
    out, j = [], 0
    ends = sorted(ends)
    for start in sorted(starts):
        while j < len(ends) and ends[j] < start:
            j += 1
        if j == len(ends):
            break
        out.append((start, ends[j]))
        j += 1
    return out


def add_intervals(apply: Application, rule: Rule, event_rows: np.ndarray,
                  request_id: pa.Array | pa.ChunkedArray | None) -> None:
    """Add ``rule``'s intervals to ``apply.derived``.

    Args:
        apply: the application (its table, attributes, and ``add`` for derived rows).
        rule: an interval rule.
        event_rows: the point-event rows named as one of the rule's events.
        request_id: the request ids after the mapping's fills (None: the column's own).
    """
    col = apply.table.column
    take = pa.array(event_rows)
    names = col("name").take(take).to_pylist()
    parents = col("parent_id").take(take).to_pylist()
    traces = col("trace_id").take(take).to_pylist()
    wanted = sorted({p for p in parents if p})
    if not wanted:
        return
    # The spans that carry the events: rows whose span id is one of the events' parents.
    carriers = np.flatnonzero(np.asarray(
        pc.fill_null(pc.is_in(col("span_id"), value_set=pa.array(wanted, pa.string())),
                     False), dtype=bool))
    carriers = carriers[apply.start[carriers] != apply.end[carriers]]
    if not len(carriers):
        return
    at = pa.array(carriers)
    keys = zip(col("trace_id").take(at).to_pylist(), col("span_id").take(at).to_pylist(),
               col("name").take(at).to_pylist(), col("service").take(at).to_pylist(),
               carriers.tolist(), strict=True)
    span_of = {(t, s): row for t, s, name, service, row in keys
               if rule.matches_pair(service or "", name)
               and rule.matches_attributes(apply.attributes(row))}
    if not span_of:
        return
    times: dict[int, tuple[list[int], list[int]]] = {}
    for name, parent, trace, row in zip(names, parents, traces, event_rows.tolist(),
                                        strict=True):
        span = span_of.get((trace, parent))
        if span is None:
            continue
        starts, ends = times.setdefault(span, ([], []))
        (starts if name == rule.from_event else ends).append(int(apply.start[row]))
    derive = f"{DERIVE_EVENTS}{rule.stage}:{rule.from_event or ''}..{rule.to_event or ''}"
    label = f"{rule.from_event or 'start'}..{rule.to_event or 'end'}"
    for span, (starts, ends) in sorted(times.items()):
        if rule.from_event is None:
            starts = [int(apply.start[span])]
        if rule.to_event is None:
            ends = [int(apply.end[span])]
        for k, (start_ns, end_ns) in enumerate(pair(starts, ends)):
            if end_ns > start_ns:
                apply.add(span, request_id, derive, label, rule.stage, start_ns, end_ns,
                          index=k)
