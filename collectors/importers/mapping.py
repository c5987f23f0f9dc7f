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
import json
import os
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Any

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
        return self.matches_name(name) and _match(service, self.service)

    def matches_name(self, name: str) -> bool:
        """Whether ``name`` fits the rule's name pattern."""
        return _match(name, self.name) if _GLOB & set(self.name) else name == self.name

    def fits_any(self, services: list[str], names: list[str]) -> bool:
        """Whether some pair of ``services`` and ``names`` fits the rule's patterns."""
        return (any(self.matches_name(n) for n in names)
                and any(_match(s, self.service) for s in services))

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
    """The built-in table (``mappings.toml``: vLLM, SGLang, TGI)."""
    text = resources.files(__package__).joinpath("mappings.toml").read_text()
    return StageMapping._parse(text, "mappings.toml", "")


def load_mapping(path: str | os.PathLike[str]) -> StageMapping:
    """The built-in table extended by a user's TOML file (its rules win)."""
    return default_mapping().extended(StageMapping.from_toml(path))
