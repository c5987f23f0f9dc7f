"""Stage mappings: other systems' span names → ttft's stages, kept as data.

A `StageMapping` is an ordered table of `Rule` rows. `apply` gives every row of an
imported span table whose stage is still ``other`` the stage of the first rule that matches
its ``(service, name, attributes)``; a row whose stage was already set (a ``ttft.stage``
attribute, a span named exactly as a canonical stage) keeps it, except where a rule says
``replace`` and the row's stage came from its name (a false friend such as TGI's
``schedule`` envelope). Rules with ``derive`` also add rows the source only implies: the
intervals vLLM reports as durations, or a boundary event at the end of a span.

The built-in table is ``mappings.toml`` next to this module (vLLM, SGLang, TGI; its comments
name the sources each choice rests on). A user file passed with ``--mapping`` has the same
format, and its rules are tried first.

TOML format: a list of ``[[rule]]`` tables, nothing else at the top level::

    [[rule]]
    stage = "queue"              # required: a canonical stage, or "event"
    name = "prefill_waiting"     # required: span name, exact, or a glob if it has * ? [
    service = "sglang*"          # glob on the service (default "*")
    attribute = "rid"            # "key" (present) or "key=value" (equal as text)
    source = "sglang"            # where the rule comes from (default "user")
    derive = "first_end:first_sampled"   # see below
    replace = false              # also re-map rows whose stage came from their name
    first = false                # only the earliest-starting matching row of each trace

A rule with ``stage = "event"`` matches point rows only (``start_ns == end_ns``). Derivations:

- ``vllm_latency``: from the seconds in ``gen_ai.latency.time_in_queue``,
  ``time_in_model_prefill`` and ``time_to_first_token`` of a span that starts at the
  request's arrival, children ``queue`` ``[t0, t0+q)`` and ``prefill`` ``[t0+q, t0+q+p)``
  and the event ``first_sampled`` at ``t0+ttft``. A duration that is missing, not a
  number or negative places nothing; time the durations do not place stays uncovered.
- ``first_end:NAME``: a point event ``NAME`` at the end of the earliest-starting row the
  rule matched in each trace.

Derived rows share the trace, service, clock and request id of the row they come from,
are its children, and get span ids hashed from its span id, so applying twice gives the
same table. A row without a request id takes its ``gen_ai.request.id`` attribute.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ttft.tracer.schema import DERIVED_STAGES, EV_FIRST_SAMPLED, STAGE_NAMES

MAPPABLE_STAGES = tuple(s for s in STAGE_NAMES if s not in DERIVED_STAGES)
"""Stages a rule may name: every canonical stage but the ones analysis derives."""
DERIVE_VLLM = "vllm_latency"
DERIVE_FIRST_END = "first_end:"
REQUEST_ID_ATTRIBUTE = "gen_ai.request.id"
VLLM_QUEUE_S = "gen_ai.latency.time_in_queue"
VLLM_PREFILL_S = "gen_ai.latency.time_in_model_prefill"
VLLM_TTFT_S = "gen_ai.latency.time_to_first_token"
_GLOB = frozenset("*?[")
_MAX_S = 2**60 / 1e9
_TYPES = {"stage": str, "name": str, "service": str, "attribute": str, "source": str,
          "derive": str, "replace": bool, "first": bool}


class RuleError(ValueError):
    """A rule with a bad field; ``field`` names it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"field {field!r}: {reason}")
        self.field = field


@dataclass(frozen=True)
class Rule:
    """One row of a mapping table (the fields are the TOML keys of the module docstring).

    Raises:
        RuleError: an unknown stage, an empty name, a malformed attribute or derive.
    """

    stage: str
    name: str
    service: str = "*"
    attribute: str | None = None
    source: str = ""
    derive: str | None = None
    replace: bool = False
    first: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and not isinstance(value, _TYPES[f.name]):
                kind = _TYPES[f.name].__name__
                raise RuleError(f.name, f"expected {kind}, got {type(value).__name__}")
        if self.stage not in MAPPABLE_STAGES:
            raise RuleError("stage", f"unknown stage {self.stage!r}; one of "
                            f"{', '.join(MAPPABLE_STAGES)}")
        if not self.name:
            raise RuleError("name", "must not be empty")
        if self.attribute is not None and not self.attribute.partition("=")[0]:
            raise RuleError("attribute", "expected 'key' or 'key=value'")
        if self.derive is not None and self.derive != DERIVE_VLLM and not (
            self.derive.startswith(DERIVE_FIRST_END) and self.derive[len(DERIVE_FIRST_END):]
        ):
            raise RuleError("derive", f"unknown derivation {self.derive!r}; expected "
                            f"{DERIVE_VLLM!r} or '{DERIVE_FIRST_END}EVENT_NAME'")

    def matches_pair(self, service: str, name: str) -> bool:
        """Whether ``(service, name)`` fits the rule's name and service patterns."""
        name_ok = _match(name, self.name) if _GLOB & set(self.name) else name == self.name
        return name_ok and _match(service, self.service)

    def matches_attributes(self, attributes: dict[str, Any]) -> bool:
        """Whether the attribute condition holds (always, without one)."""
        if self.attribute is None:
            return True
        key, sep, value = self.attribute.partition("=")
        if key not in attributes:
            return False
        got = attributes[key]
        return not sep or (got if isinstance(got, str) else json.dumps(got)) == value


@lru_cache(maxsize=4096)
def _match(text: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(text, pattern)


@dataclass(frozen=True)
class StageMapping:
    """An ordered table of rules; the first rule that matches a row wins."""

    rules: tuple[Rule, ...] = ()

    @classmethod
    def from_toml(
        cls, path: str | os.PathLike[str], *, source: str = "user"
    ) -> StageMapping:
        """Read ``[[rule]]`` tables from a TOML file; ``source`` fills a missing ``source``.

        Raises:
            ValueError: unreadable or not TOML, or a bad rule; the message names the file,
                the rule (``[[rule]]`` tables counted from 1) and the field.
        """
        try:
            with open(path, "rb") as f:
                text = f.read().decode()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: cannot read the mapping file ({exc})") from None
        return cls._parse(text, str(path), source)

    @classmethod
    def _parse(cls, text: str, origin: str, source: str) -> StageMapping:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{origin}: not TOML ({exc})") from None
        extra = sorted(set(data) - {"rule"})
        if extra:
            raise ValueError(f"{origin}: unknown top-level key(s) {', '.join(extra)}; "
                             "expected only [[rule]] tables")
        tables = data.get("rule", [])
        if not isinstance(tables, list):
            raise ValueError(f"{origin}: 'rule' must be an array of tables ([[rule]])")
        rules = []
        for index, table in enumerate(tables, start=1):
            where = f"{origin}: rule {index}"
            if not isinstance(table, dict):
                raise ValueError(f"{where}: expected a table")
            unknown = sorted(set(table) - set(_TYPES))
            if unknown:
                raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
            for key in ("stage", "name"):
                if key not in table:
                    raise ValueError(f"{where}: field {key!r}: missing")
            try:
                rules.append(Rule(**{"source": source, **table}))
            except RuleError as exc:
                raise ValueError(f"{where}: {exc}") from None
        return cls(tuple(rules))

    def extended(self, other: StageMapping) -> StageMapping:
        """This table with ``other``'s rules in front (so they win)."""
        return StageMapping(other.rules + self.rules)

    def apply(self, table: pa.Table) -> pa.Table:
        """Map the stages of a span table (``tracer.schema.SPAN_SCHEMA``) and add the
        derived rows; the schema and its metadata are kept. Returns ``table`` itself when
        nothing changes. Never raises on attribute contents: a row whose attributes are
        not a JSON object has none."""
        return _Apply(self.rules, table).run()


@lru_cache(maxsize=1)
def default_mapping() -> StageMapping:
    """The built-in table (``mappings.toml``: vLLM, SGLang, TGI)."""
    text = resources.files(__package__).joinpath("mappings.toml").read_text()
    return StageMapping._parse(text, "mappings.toml", "")


def load_mapping(path: str | os.PathLike[str]) -> StageMapping:
    """The built-in table extended by a user's TOML file (its rules win)."""
    return default_mapping().extended(StageMapping.from_toml(path))


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[Any]]:
    """Dictionary codes (int64, -1 for null) and the values they index."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(pa.string())
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = column.dictionary_encode()
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, encoded.dictionary.to_pylist()


def _seconds_ns(value: Any) -> int | None:
    """Seconds → ns; None for a non-number, a negative or an absurd (> 2^60 ns) value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or not 0 <= value <= _MAX_S:
        return None
    return round(value * 1e9)


class _Apply:
    """One application of a rule table to one span table."""

    def __init__(self, rules: tuple[Rule, ...], table: pa.Table) -> None:
        self.rules, self.table = rules, table
        self._attrs: dict[int, dict[str, Any]] = {}
        self._trace: np.ndarray | None = None
        self.derived: list[dict[str, Any]] = []
        self.start = table.column("start_ns").to_numpy().astype(np.int64)
        self.end = table.column("end_ns").to_numpy().astype(np.int64)

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
        if table.num_rows == 0:
            return table
        stage, stage_values = _codes(table.column("stage"))
        assigned = self.assign(stage, stage_values)
        request_id = self.fill_request_ids()
        hit = np.flatnonzero(assigned >= 0)
        for r, rule in enumerate(self.rules):
            if rule.derive is not None:
                rows = hit[assigned[hit] == r]
                if len(rows):
                    self.derive(rule, rows, request_id)
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

    def assign(self, stage: np.ndarray, stage_values: list[str]) -> np.ndarray:
        """Rule index per row (-1: no rule), first matching rule wins."""
        n = self.table.num_rows
        assigned = np.full(n, -1, np.int64)
        if not self.rules:
            return assigned
        name, name_values = _codes(self.table.column("name"))
        service, service_values = _codes(self.table.column("service"))
        code_of = {v: i for i, v in enumerate(stage_values)}
        is_other = stage == code_of.get("other", -2)
        is_event = stage == code_of.get("event", -2)
        # The stage came from the name when its text equals the row's name.
        name_code = {v: i for i, v in enumerate(name_values)}
        as_name = np.array([name_code.get(v, -2) for v in stage_values] + [-2])
        from_name = (as_name[stage] == name) & ~is_other
        point = self.start == self.end
        cand = np.flatnonzero(is_other | from_name | (is_event & point))
        if not len(cand):
            return assigned
        # One pattern check per distinct (service, name); code -1 (null) reads as "".
        services, names = [*service_values, ""], [*name_values, ""]
        base = len(names)
        key = (service[cand] % len(services)) * base + name[cand] % base
        pairs, inv = np.unique(key, return_inverse=True)
        pair_names = [(services[p // base], names[p % base]) for p in pairs.tolist()]
        for r, rule in enumerate(self.rules):
            ok = np.array([rule.matches_pair(s, m) for s, m in pair_names])
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

    def fill_request_ids(self) -> pa.Array | None:
        """``request_id`` with ``gen_ai.request.id`` filled in where it was null, or None
        when no row changes."""
        rid = self.table.column("request_id")
        attrs = self.table.column("attributes")
        maybe = pc.and_(pc.is_null(rid), pc.fill_null(
            pc.match_substring(attrs, f'"{REQUEST_ID_ATTRIBUTE}"'), False))
        rows = np.flatnonzero(np.asarray(maybe, dtype=bool))
        found = {}
        for row in rows.tolist():
            value = self.attributes(row).get(REQUEST_ID_ATTRIBUTE)
            if isinstance(value, (str, int)) and not isinstance(value, bool):
                found[row] = str(value)
        if not found:
            return None
        values = rid.to_pylist()
        for row, value in found.items():
            values[row] = value
        return pa.array(values, pa.string())

    def derive(self, rule: Rule, rows: np.ndarray, request_id: pa.Array | None) -> None:
        assert rule.derive is not None
        if rule.derive == DERIVE_VLLM:
            for row in rows.tolist():
                self.derive_vllm(row, request_id)
            return
        event = rule.derive[len(DERIVE_FIRST_END):]
        for row in self.earliest_per_trace(rows).tolist():
            t = int(self.end[row])
            self.add(row, request_id, rule.derive, event, "event", t, t)

    def derive_vllm(self, row: int, request_id: pa.Array | None) -> None:
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

    def add(self, row: int, request_id: pa.Array | None, derive: str, name: str, stage: str,
            start_ns: int, end_ns: int) -> None:
        """A derived row: a child of ``row``, its span id hashed from ``row``'s."""
        col = self.table.column
        trace_id, span_id = col("trace_id")[row].as_py(), col("span_id")[row].as_py()
        seed = f"{trace_id}/{span_id if span_id is not None else row}/{derive}/{name}"
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
            "attributes": json.dumps({"ttft.derived": derive}),
        })
