"""Stage mappings: other systems' span names → ttft's stages, kept as data.

A `StageMapping` is an ordered table of `Rule` rows. `apply` gives every row of an
imported span table whose stage is still ``other`` the stage of the first rule that matches
its ``(service, name, attributes)``; a row whose stage was already set (a ``ttft.stage``
attribute, a span named exactly as a canonical stage) keeps it, except where a rule says
``replace`` and the row's stage came from its name (a false friend such as TGI's
``schedule`` envelope). Rules with ``derive`` also add rows the source only implies: the
intervals vLLM reports as durations, or a boundary event at the end of a span. Interval
rules (``from_event``/``to_event``) add the time between two events of a span as a stage.

The built-in table is ``mappings.toml`` next to this module (vLLM, SGLang, TGI, llm-d,
TensorRT-LLM; its comments name the sources each choice rests on). A user file passed with
``--mapping`` has the same format, and its rules are tried first.

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
    request_id = "rid"           # rows it maps without a request id take this attribute
    join = "bootstrap_room"      # rows it maps join another trace's request (below)
    from_event = "journey.QUEUED"      # an interval rule (below); without it, the span's start
    to_event = "journey.SCHEDULED"     # without it, the span's end

A rule with ``stage = "event"`` matches point rows only (``start_ns == end_ns``). Derivations:

- ``vllm_latency``: from the seconds in ``gen_ai.latency.time_in_queue``,
  ``time_in_model_prefill`` and ``time_to_first_token`` of a span that starts at the
  request's arrival, children ``queue`` ``[t0, t0+q)`` and ``prefill`` ``[t0+q, t0+q+p)``
  and the event ``first_sampled`` at ``t0+ttft``. A duration that is missing, not a
  number or negative places nothing; time the durations do not place stays uncovered.
- ``first_end:NAME``: a point event ``NAME`` at the end of the earliest-starting row the
  rule matched in each trace.

Interval rules: a rule with ``from_event`` and/or ``to_event`` (event names, exact) changes
no row's stage and takes no part in "first match wins"; every one applies. On each span it
matches (``name``, ``service``, ``attribute``), the span's events (point-event rows whose
parent is the span, as the OTLP and Jaeger importers keep span events and logs) give
intervals of stage ``stage``: each occurrence of ``from_event``, in time order, runs to the
first occurrence of ``to_event`` at or after it that no earlier one took. Without
``from_event`` the span's start is the one start, without ``to_event`` its end the one end.
An interval rule takes no ``derive``, ``replace``, ``first``, ``request_id`` or ``join``.

Request ids join traces whose context was lost (docs/design.md, "The span record"). A row
without one takes its ``gen_ai.request.id`` attribute, or, when a rule with ``request_id``
maps it, that attribute first. A rule with ``join = "KEY"``: each row it maps, without a
request id, takes the request id of the traces in which another row (one no ``join`` rule
maps) carries the same value of attribute ``KEY`` (the smallest, as analysis picks a
trace's); when those traces have none, the rows on both sides take ``KEY=value``.

Derived rows share the trace, service, clock and request id of the row they come from,
are its children, and get span ids hashed from its span id; a derived row the table holds
already is not added again, so a mapped table mapped again stays as it is.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np
import pyarrow as pa

from ttft.collectors.importers._mapping_apply import (
    DERIVE_FIRST_END,
    DERIVE_VLLM,
    Apply,
)
from ttft.tracer.schema import DERIVED_STAGES, STAGE_NAMES

MAPPABLE_STAGES = tuple(s for s in STAGE_NAMES if s not in DERIVED_STAGES)
"""Stages a rule may name: every canonical stage but the ones analysis derives."""
_GLOB = frozenset("*?[")
_TYPES = {"stage": str, "name": str, "service": str, "attribute": str, "source": str,
          "derive": str, "replace": bool, "first": bool, "request_id": str, "join": str,
          "from_event": str, "to_event": str}
_NOT_WITH_INTERVAL = ("derive", "replace", "first", "request_id", "join")


class RuleError(ValueError):
    """A rule with a bad field; ``field`` names it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"field {field!r}: {reason}")
        self.field = field


@dataclass(frozen=True)
class Rule:
    """One row of a mapping table (the fields are the TOML keys of the module docstring).

    Raises:
        RuleError: an unknown stage, an empty name, a malformed attribute or derive, an
            interval rule with a field it cannot have.
    """

    stage: str
    name: str
    service: str = "*"
    attribute: str | None = None
    source: str = ""
    derive: str | None = None
    replace: bool = False
    first: bool = False
    request_id: str | None = None
    join: str | None = None
    from_event: str | None = None
    to_event: str | None = None

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
        for key in ("request_id", "join", "from_event", "to_event"):
            if getattr(self, key) == "":
                raise RuleError(key, "must not be empty")
        if self.is_interval:
            if self.from_event == self.to_event:
                raise RuleError("to_event", "must differ from from_event")
            if self.stage == "event":
                raise RuleError("stage", "an interval rule (from_event/to_event) needs a "
                                "stage with a duration, not 'event'")
            for key in _NOT_WITH_INTERVAL:
                if getattr(self, key) not in (None, False):
                    raise RuleError(key, "not allowed in an interval rule "
                                    "(from_event/to_event)")

    @property
    def is_interval(self) -> bool:
        """Whether this is an interval rule (``from_event`` or ``to_event`` set)."""
        return self.from_event is not None or self.to_event is not None

    @property
    def events(self) -> tuple[str, ...]:
        """The event names an interval rule pairs (none for other rules)."""
        return tuple(e for e in (self.from_event, self.to_event) if e is not None)

    def matches_pair(self, service: str, name: str) -> bool:
        """Whether ``(service, name)`` fits the rule's name and service patterns."""
        return self.matches_name(name) and _match(service, self.service)

    def matches_name(self, name: str) -> bool:
        """Whether ``name`` fits the rule's name pattern."""
        return _match(name, self.name) if _GLOB & set(self.name) else name == self.name

    def fits_any(self, services: list[str], names: list[str],
                 name_set: frozenset[str] | None = None) -> bool:
        """Whether some pair of ``services`` and ``names`` fits the rule's patterns (and,
        for an interval rule, whether ``names`` hold its event names; ``name_set``: the
        same names as a set, to look them up without a scan)."""
        if not any(_match(s, self.service) for s in services):
            return False
        present = frozenset(names) if name_set is None else name_set
        if not all(e in present for e in self.events):
            return False
        if _GLOB & set(self.name):
            return any(self.matches_name(n) for n in names)
        return self.name in present

    def pair_mask(self, services: list[str], names: list[str], name_index: dict[str, int],
                  pair_service: np.ndarray, pair_name: np.ndarray) -> np.ndarray:
        """Which (service, name) pairs, given as codes into ``services`` and ``names``, fit
        the rule's patterns: a name pattern is tried only on names paired with a service
        the rule's fits, and an exact name is one lookup in ``name_index``."""
        service_ok = np.fromiter((_match(s, self.service) for s in services), bool,
                                 len(services))
        ok = service_ok[pair_service]
        if not ok.any():
            return ok
        if _GLOB & set(self.name):
            codes = np.unique(pair_name[ok])
            good = codes[np.fromiter((self.matches_name(names[c]) for c in codes.tolist()),
                                     bool, len(codes))]
            return ok & np.isin(pair_name, good)
        return ok & (pair_name == name_index.get(self.name, -1))

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
        return Apply(self.rules, table).run()


@lru_cache(maxsize=1)
def default_mapping() -> StageMapping:
    """The built-in table (``mappings.toml``: vLLM, SGLang, TGI, llm-d, TensorRT-LLM)."""
    text = resources.files(__package__).joinpath("mappings.toml").read_text()
    return StageMapping._parse(text, "mappings.toml", "")


def load_mapping(path: str | os.PathLike[str]) -> StageMapping:
    """The built-in table extended by a user's TOML file (its rules win)."""
    return default_mapping().extended(StageMapping.from_toml(path))
