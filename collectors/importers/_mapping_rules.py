"""One row of a stage mapping (`Rule`), as the TOML file states it, checked as it is made,
and what applying rules to a table offers the rule mechanics (`Application`); the table of
rules and its reading are ``mapping``, the applying ``_mapping_apply``.

This module imports none of the others, so the rule, the applier, the interval rules and
the request ids depend on it and never on each other in a circle."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from ttft.tracer.schema import DERIVED_STAGES, STAGE_NAMES

DERIVE_VLLM = "vllm_latency"
DERIVE_FIRST_END = "first_end:"
MAPPABLE_STAGES = tuple(s for s in STAGE_NAMES if s not in DERIVED_STAGES)
"""Stages a rule may name: every canonical stage but the ones analysis derives."""
_GLOB = frozenset("*?[")
FIELD_TYPES = {"stage": str, "name": str, "service": str, "attribute": str, "source": str,
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
            if value is not None and not isinstance(value, FIELD_TYPES[f.name]):
                kind = FIELD_TYPES[f.name].__name__
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




class Application(Protocol):
    """What the interval rules and the request ids read of one application of rules to a
    table (``_mapping_apply.Apply``)."""

    rules: tuple[Rule, ...]
    table: pa.Table
    start: np.ndarray
    end: np.ndarray
    derived: list[dict[str, Any]]

    def attributes(self, row: int) -> dict[str, Any]: ...

    def add(self, row: int, request_id: pa.Array | pa.ChunkedArray | None, derive: str,
            name: str, stage: str, start_ns: int, end_ns: int, index: int = 0) -> None: ...
