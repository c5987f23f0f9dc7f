"""Request ids in a stage mapping: filled in from attributes, and traces joined by a key (the
mechanics behind a rule's ``request_id`` and ``join`` and the ``gen_ai.request.id`` fill;
`ttft.collectors.importers.mapping` states the rules)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ttft.collectors.importers._mapping_rules import Application

REQUEST_ID_ATTRIBUTE = "gen_ai.request.id"


def _text(value: Any) -> str | None:
    """An attribute value as a request id: a non-empty string or an integer, as text."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return str(value) or None


def mentions(texts: pa.ChunkedArray, needle: bytes) -> bool:
    """Whether any value of a string column may contain ``needle``: one search of each
    chunk's bytes in place (a row-by-row match over 24M attribute texts took 1.3 s; a
    search of each chunk's bytes copied out 0.16 s, this one about 0.07)."""
    literal = re.compile(re.escape(needle))
    for chunk in texts.chunks:
        if len(chunk) == 0:
            continue
        if not pa.types.is_string(chunk.type):
            return True  # another layout: the row-by-row match decides
        data = chunk.buffers()[2]
        if data is None:  # every value empty or null
            continue
        offsets = np.frombuffer(chunk.buffers()[1], np.int32)
        first, last = int(offsets[chunk.offset]), int(offsets[chunk.offset + len(chunk)])
        if literal.search(memoryview(data)[first:last]) is not None:
            return True
    return False


def rows_mentioning(texts: pa.ChunkedArray, key: str) -> np.ndarray:
    """Rows whose attribute text contains ``"key"`` (a superset of the rows with the key)."""
    quoted = f'"{key}"'
    if not mentions(texts, quoted.encode()):
        return np.empty(0, np.int64)
    return np.flatnonzero(np.asarray(
        pc.fill_null(pc.match_substring(texts, quoted), False), dtype=bool))


class RequestIds:
    """The ``request_id`` column of one application, with the fills collected so far."""

    def __init__(self, apply: Application) -> None:
        self.apply = apply
        self.column = apply.table.column("request_id")
        self.fills: dict[int, str] = {}

    def missing(self, rows: np.ndarray) -> np.ndarray:
        """Of ``rows``, those without a request id (null or empty) and not yet filled."""
        if not len(rows):
            return rows
        have = self.column.take(pa.array(rows)).to_pylist()
        return np.asarray([r for r, v in zip(rows.tolist(), have, strict=True)
                           if not v and r not in self.fills], np.int64)

    def fill_from(self, rows: np.ndarray, key: str) -> None:
        """Give each of ``rows`` without a request id its attribute ``key``, if usable."""
        for row in self.missing(rows).tolist():
            value = _text(self.apply.attributes(row).get(key))
            if value is not None:
                self.fills[row] = value

    def result(self) -> pa.Array | pa.ChunkedArray:
        """The column with every fill applied (the column itself without any)."""
        if not self.fills:
            return self.column
        rows = np.fromiter(self.fills, np.int64, len(self.fills))
        order = np.argsort(rows)
        mask = np.zeros(len(self.column), bool)
        mask[rows] = True
        values = [self.fills[int(r)] for r in rows[order]]
        column = self.column
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        return pc.replace_with_mask(column, pa.array(mask), pa.array(values, pa.string()))

    def join(self, rows: np.ndarray, key: str, partners: np.ndarray) -> None:
        """Give each of ``rows`` without a request id the one of the traces where a row of
        ``partners`` carries the same value of attribute ``key`` (the smallest of them);
        where those traces have none, both sides take ``key=value``."""
        attrs = self.apply.attributes
        mine = {row: v for row in self.missing(rows).tolist()
                if (v := _text(attrs(row).get(key))) is not None}
        wanted = set(mine.values())
        by_value: dict[str, list[int]] = {}
        for row in partners.tolist():
            v = _text(attrs(row).get(key))
            if v in wanted:
                by_value.setdefault(v, []).append(row)
        if not by_value:
            return
        trace = self.apply.table.column("trace_id")
        partner_rows = np.asarray(sorted({r for rs in by_value.values() for r in rs}))
        trace_of = dict(zip(partner_rows.tolist(),
                            trace.take(pa.array(partner_rows)).to_pylist(), strict=True))
        ids = self._smallest_ids(trace, sorted(set(trace_of.values())))
        for row, v in mine.items():
            sides = by_value.get(v)
            if not sides:
                continue
            found = [ids[trace_of[p]] for p in sides if trace_of[p] in ids]
            if found:
                self.fills[row] = min(found)
                continue
            named = f"{key}={v}"
            self.fills[row] = named
            for p in self.missing(np.asarray(sides, np.int64)).tolist():
                self.fills[p] = named

    def _smallest_ids(self, trace: pa.ChunkedArray, traces: list[str]) -> dict[str, str]:
        """Each of ``traces``' smallest request id (fills included); traces without one are
        left out."""
        inside = np.flatnonzero(np.asarray(
            pc.is_in(trace, value_set=pa.array(traces, pa.string())), dtype=bool))
        ids = self.result().take(pa.array(inside))
        table = pa.table({"t": trace.take(pa.array(inside)), "r": ids})
        table = table.filter(pc.fill_null(pc.not_equal(table.column("r"), ""), False))
        best = table.group_by("t").aggregate([("r", "min")])
        return dict(zip(best.column("t").to_pylist(), best.column("r_min").to_pylist(),
                        strict=True))


def request_ids(apply: Application, assigned: np.ndarray) -> pa.Array | pa.ChunkedArray | None:
    """``request_id`` with the fills of `ttft.collectors.importers.mapping`'s rules applied
    (a rule's ``request_id``, then ``gen_ai.request.id``, then ``join``), or None when no
    row changes. Only rows a rule mapped, or whose attribute text mentions a key, are
    looked at one by one."""
    ids = RequestIds(apply)
    rules = apply.rules
    for r, rule in enumerate(rules):
        if rule.request_id is not None:
            ids.fill_from(np.flatnonzero(assigned == r), rule.request_id)
    texts = apply.table.column("attributes")
    ids.fill_from(rows_mentioning(texts, REQUEST_ID_ATTRIBUTE), REQUEST_ID_ATTRIBUTE)
    joining = [r for r, rule in enumerate(rules) if rule.join is not None]
    for r in joining:
        rows = np.flatnonzero(assigned == r)
        if not len(rows):
            continue
        key = rules[r].join
        assert key is not None
        partners = rows_mentioning(texts, key)
        partners = partners[~np.isin(assigned[partners], joining)]
        ids.join(rows, key, partners)
    return ids.result() if ids.fills else None
