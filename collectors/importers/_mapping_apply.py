"""Applying a stage mapping to a span table: stage assignment and derived rows (the
mechanics behind `ttft.collectors.importers.mapping.StageMapping.apply`; request ids in
``_mapping_ids``, interval rules in ``_mapping_events``)."""

from __future__ import annotations

import hashlib
import json
import math
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ttft.collectors.importers._mapping_events import add_intervals
from ttft.collectors.importers._mapping_ids import (
    REQUEST_ID_ATTRIBUTE,
    mentions,
    request_ids,
    rows_mentioning,
)
from ttft.collectors.importers._mapping_rules import DERIVE_FIRST_END, DERIVE_VLLM, Rule
from ttft.tracer.schema import EV_FIRST_SAMPLED

DERIVED_ATTRIBUTE = "ttft.derived"
"""The attribute of every derived row: the derivation that made it."""
VLLM_QUEUE_S = "gen_ai.latency.time_in_queue"
VLLM_PREFILL_S = "gen_ai.latency.time_in_model_prefill"
VLLM_TTFT_S = "gen_ai.latency.time_to_first_token"
_MAX_S = 2**60 / 1e9


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[Any]]:
    """Dictionary codes (int64, -1 for null) and the distinct values they index.

    A dictionary column keeps its indices, mapped through its (small) dictionary made
    distinct: casting it to strings first would hash every row again (3 s at 24M rows)."""
    if not pa.types.is_dictionary(column.type):
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        encoded = column.dictionary_encode()
        codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        return codes, encoded.dictionary.to_pylist()
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if not chunks:
        return np.empty(0, np.int64), []
    # Every chunk's dictionary, one after another, made distinct (a null value too).
    distinct = pa.concat_arrays([c.dictionary for c in chunks]).dictionary_encode()
    remap = distinct.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    out, at = [], 0
    for chunk in chunks:
        mine = np.append(remap[at : at + len(chunk.dictionary)], -1)
        at += len(chunk.dictionary)
        out.append(mine[chunk.indices.fill_null(-1).to_numpy(zero_copy_only=False)])
    return np.concatenate(out), distinct.dictionary.to_pylist()


def _distinct(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """A column's distinct non-null values (a dictionary column's: every chunk's
    dictionary, some maybe unused), found without coding each row (`_codes`): 0.02
    against 0.1-0.3 s at 2.4M rows."""
    if pa.types.is_dictionary(column.type):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        if not chunks:
            return []
        return pc.unique(pa.concat_arrays([c.dictionary for c in chunks])).drop_null().to_pylist()
    return pc.unique(column).drop_null().to_pylist()


def _dense_unique(key: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True)`` for keys in ``[0, size)``: by a presence
    table where ``size`` is small against the keys (an argsort of 24M keys took 4.5 s)."""
    if size > 4 * len(key) + 65_536:
        return np.unique(key, return_inverse=True)
    present = np.zeros(size, bool)
    present[key] = True
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present), rank[key]


def _seconds_ns(value: Any) -> int | None:
    """Seconds → ns; None for a non-number, a negative or an absurd (> 2^60 ns) value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or not 0 <= value <= _MAX_S:
        return None
    return round(value * 1e9)


class Apply:
    """One application of a rule table to one span table."""

    def __init__(self, rules: tuple[Rule, ...], table: pa.Table) -> None:
        self.rules, self.table = rules, table
        self._attrs: dict[int, dict[str, Any]] = {}
        self._trace: np.ndarray | None = None
        self.derived: list[dict[str, Any]] = []
        # Set by `assign` when some rule fits the table: name codes, their values, the
        # point-event rows (stage event, no duration).
        self._names: tuple[np.ndarray, list[Any]] | None = None
        self._event_points: np.ndarray | None = None

    @cached_property
    def start(self) -> np.ndarray:
        """Every row's start (read where a rule acts: a copy of a table of many chunks)."""
        return np.asarray(self.table.column("start_ns").to_numpy(), np.int64)

    @cached_property
    def end(self) -> np.ndarray:
        """Every row's end (as `start`)."""
        return np.asarray(self.table.column("end_ns").to_numpy(), np.int64)

    def attributes(self, row: int) -> dict[str, Any]:
        if row not in self._attrs:
            text = self.table.column("attributes")[row].as_py()
            try:
                value = json.loads(text) if text else {}
            except ValueError:
                value = {}
            self._attrs[row] = value if isinstance(value, dict) else {}
        return self._attrs[row]

    def run(self) -> pa.Table:
        table = self.table
        if self.inert():  # a ttft trace, say: no rule to run, so no row to code
            return table
        stage, stage_values = _codes(table.column("stage"))
        assigned = self.assign(stage, stage_values)
        request_id = request_ids(self, assigned)
        hit = np.flatnonzero(assigned >= 0)
        for r, rule in enumerate(self.rules):
            if rule.derive is not None:
                rows = hit[assigned[hit] == r]
                if len(rows):
                    self.derive(rule, rows, request_id)
        self.intervals(request_id)
        self.derived = self.not_yet_there(self.derived)
        vocab = list(stage_values)
        for s in {self.rules[r].stage for r in set(assigned[hit].tolist())} - set(vocab):
            vocab.append(s)
        index = {s: i for i, s in enumerate(vocab)}
        new = stage.copy()
        new[hit] = [index[self.rules[r].stage] for r in assigned[hit]]
        changed = bool((new != stage).any())
        if not changed and request_id is None and not self.derived:
            return table
        if changed:
            codes = pa.array(new.astype(np.int32), mask=new < 0)
            column = pa.DictionaryArray.from_arrays(codes, pa.array(vocab, pa.string()))
            table = table.set_column(table.schema.get_field_index("stage"),
                                     table.schema.field("stage"), column)
        if request_id is not None:
            table = table.set_column(table.schema.get_field_index("request_id"),
                                     table.schema.field("request_id"), request_id)
        if self.derived:
            extra = pa.Table.from_pylist(self.derived, schema=table.schema)
            table = pa.concat_tables([table, extra])
        return table

    def inert(self) -> bool:
        """Whether no rule can act on this table's rows, alone or beside any other rows: no
        rule fits a (service, name) of it (a rule's joins, derivations and intervals start
        from rows it fits) and no row carries a request id to fill."""
        if self.table.num_rows == 0:
            return True
        if self._some_rule_fits:
            return False
        return not mentions(self.table.column("attributes"),
                            f'"{REQUEST_ID_ATTRIBUTE}"'.encode())

    @cached_property
    def _some_rule_fits(self) -> bool:
        """Whether some rule fits a (service, name) of the table, from its distinct values
        alone (`_distinct`; a null reads as ``""``, as in `assign`)."""
        names = [*_distinct(self.table.column("name")), ""]
        services = [*_distinct(self.table.column("service")), ""]
        name_set = frozenset(names)
        return any(rule.fits_any(services, names, name_set) for rule in self.rules)

    def assign(self, stage: np.ndarray, stage_values: list[str]) -> np.ndarray:
        """Rule index per row (-1: no rule), first matching rule wins."""
        n = self.table.num_rows
        assigned = np.full(n, -1, np.int64)
        if not self._some_rule_fits:
            return assigned  # no rule fits any row (a ttft trace): no per-row work
        name, name_values = _codes(self.table.column("name"))
        service, service_values = _codes(self.table.column("service"))
        # One pattern check per distinct (service, name); code -1 (null) reads as "".
        services, names = [*service_values, ""], [*name_values, ""]
        code_of = {v: i for i, v in enumerate(stage_values)}
        is_other = stage == code_of.get("other", -2)
        is_event = stage == code_of.get("event", -2)
        # The stage came from the name when its text equals the row's name.
        name_code = {v: i for i, v in enumerate(name_values)}
        as_name = np.array([name_code.get(v, -2) for v in stage_values] + [-2])
        from_name = (as_name[stage] == name) & ~is_other
        point = self.start == self.end
        self._names, self._event_points = (name, name_values), is_event & point
        cand = np.flatnonzero(is_other | from_name | (is_event & point))
        if not len(cand):
            return assigned
        base = len(names)
        key = (service[cand] % len(services)) * base + name[cand] % base
        pairs, inv = _dense_unique(key, len(services) * base)
        pair_service, pair_name = pairs // base, pairs % base
        name_index = {v: i for i, v in enumerate(names)}
        for r, rule in enumerate(self.rules):
            if rule.is_interval:
                continue  # adds rows (`intervals`), maps none
            ok = rule.pair_mask(services, names, name_index, pair_service, pair_name)
            if not ok.any():
                continue
            rows = cand[ok[inv] & (assigned[cand] < 0)]
            if rule.stage == "event":
                keep = point[rows] & (is_other[rows] | is_event[rows]
                                      | (rule.replace & from_name[rows]))
            else:
                keep = is_other[rows] | (rule.replace & from_name[rows])
            rows = rows[keep]
            if rule.attribute is not None and len(rows):
                rows = rows[[rule.matches_attributes(self.attributes(i)) for i in rows]]
            if rule.first and len(rows):
                rows = self.earliest_per_trace(rows)
            assigned[rows] = r
        return assigned

    def not_yet_there(self, derived: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``derived`` less the rows the table already holds (same trace and span id): a
        table mapped before (``ttft import``, then read again) keeps its rows once. Only the
        rows whose attributes mention ``ttft.derived`` are looked at."""
        if not derived:
            return derived
        rows = rows_mentioning(self.table.column("attributes"), DERIVED_ATTRIBUTE)
        if not len(rows):
            return derived
        at = pa.array(rows)
        there = set(zip(self.table.column("trace_id").take(at).to_pylist(),
                        self.table.column("span_id").take(at).to_pylist(), strict=True))
        return [d for d in derived if (d["trace_id"], d["span_id"]) not in there]

    def earliest_per_trace(self, rows: np.ndarray) -> np.ndarray:
        """Of ``rows``, the earliest-starting one of each trace (ties: the first row)."""
        if self._trace is None:
            self._trace = _codes(self.table.column("trace_id"))[0]
        trace = self._trace
        order = np.lexsort((rows, self.start[rows], trace[rows]))
        rows, keys = rows[order], trace[rows[order]]
        head = np.ones(len(rows), bool)
        head[1:] = keys[1:] != keys[:-1]
        return np.sort(rows[head])

    def intervals(self, request_id: pa.Array | pa.ChunkedArray | None) -> None:
        """Add the rows of the interval rules (`_mapping_events`), each on the point-event
        rows of its two event names only."""
        if self._names is None or self._event_points is None:
            return  # no rule fits the table
        name, name_values = self._names
        code = {v: i for i, v in enumerate(name_values)}
        for rule in self.rules:
            codes = [code.get(e, -2) for e in rule.events]
            if not codes or -2 in codes:
                continue  # not an interval rule, or an event name no row has
            rows = np.flatnonzero(np.isin(name, codes) & self._event_points)
            if len(rows):
                add_intervals(self, rule, rows, request_id)

    def derive(self, rule: Rule, rows: np.ndarray,
               request_id: pa.Array | pa.ChunkedArray | None) -> None:
        assert rule.derive is not None
        if rule.derive == DERIVE_VLLM:
            for row in rows.tolist():
                self.derive_vllm(row, request_id)
            return
        event = rule.derive[len(DERIVE_FIRST_END):]
        for row in self.earliest_per_trace(rows).tolist():
            t = int(self.end[row])
            self.add(row, request_id, rule.derive, event, "event", t, t)

    def derive_vllm(self, row: int, request_id: pa.Array | pa.ChunkedArray | None) -> None:
        attrs = self.attributes(row)
        t0 = int(self.start[row])
        queue_ns = _seconds_ns(attrs.get(VLLM_QUEUE_S))
        prefill_ns = _seconds_ns(attrs.get(VLLM_PREFILL_S))
        ttft_ns = _seconds_ns(attrs.get(VLLM_TTFT_S))
        if queue_ns is not None:
            t1 = t0 + queue_ns
            self.add(row, request_id, DERIVE_VLLM, "queue", "queue", t0, t1)
            if prefill_ns is not None:
                self.add(row, request_id, DERIVE_VLLM, "prefill", "prefill", t1, t1 + prefill_ns)
        if ttft_ns is not None:
            t = t0 + ttft_ns
            self.add(row, request_id, DERIVE_VLLM, EV_FIRST_SAMPLED, "event", t, t)

    def add(self, row: int, request_id: pa.Array | pa.ChunkedArray | None, derive: str,
            name: str, stage: str, start_ns: int, end_ns: int, index: int = 0) -> None:
        """A derived row: a child of ``row``, its span id hashed from ``row``'s (and from
        ``index``, which tells apart rows of one derivation and name)."""
        col = self.table.column
        trace_id, span_id = col("trace_id")[row].as_py(), col("span_id")[row].as_py()
        seed = f"{trace_id}/{span_id if span_id is not None else row}/{derive}/{name}"
        if index:
            seed += f"/{index}"
        rid = (request_id if request_id is not None else col("request_id"))[row].as_py()
        self.derived.append({
            "trace_id": trace_id,
            "span_id": hashlib.blake2b(seed.encode(), digest_size=8).hexdigest(),
            "parent_id": span_id,
            "request_id": rid,
            "name": name,
            "stage": stage,
            "start_ns": start_ns,
            "end_ns": end_ns,
            "clock": col("clock")[row].as_py(),
            "service": col("service")[row].as_py(),
            "attributes": json.dumps({DERIVED_ATTRIBUTE: derive}),
        })
