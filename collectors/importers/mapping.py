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

import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import pyarrow as pa

from ttft.collectors.importers._mapping_apply import Apply
from ttft.collectors.importers._mapping_rules import FIELD_TYPES, Rule, RuleError


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
            unknown = sorted(set(table) - set(FIELD_TYPES))
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

    def inert(self, table: pa.Table) -> bool:
        """Whether no rule can act on any row of ``table``, whatever other rows it is read
        with: then ``apply`` leaves it as it is, alone or as part of a larger table, and a
        trace made of such tables can be read a table at a time (``ttft partition``). A
        join or an interval rule acts on rows of several tables together, so a table one
        of them fits is not inert even when ``apply`` of it alone changes nothing."""
        return Apply(self.rules, table).inert()


@lru_cache(maxsize=1)
def default_mapping() -> StageMapping:
    """The built-in table (``mappings.toml``: vLLM, SGLang, TGI, llm-d, TensorRT-LLM)."""
    text = resources.files(__package__).joinpath("mappings.toml").read_text()
    return StageMapping._parse(text, "mappings.toml", "")


def load_mapping(path: str | os.PathLike[str]) -> StageMapping:
    """The built-in table extended by a user's TOML file (its rules win)."""
    return default_mapping().extended(StageMapping.from_toml(path))
