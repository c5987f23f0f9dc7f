"""The span record, the stage vocabulary, event names and TTFT boundaries.

This module is the one place every other module takes these definitions from
(docs/design.md, "The span record", "Stages", "TTFT windows"). It imports nothing of ttft and
no torch, so every tool that only reads traces stays light.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # pyarrow is imported where a table is made or read, not for the names
    import pyarrow as pa

SCHEMA_VERSION: Final[int] = 2
"""Bumped whenever a column is added, removed or changes meaning. Version 2 holds the
W3C ids as bytes (``SPAN_SCHEMA_V2``); version 1 (``SPAN_SCHEMA``) as hex text. Files of
either are read forever, and ``tracer.span_ids`` converts between them (docs/design.md,
"Schema versions")."""

METADATA_KEY: Final[bytes] = b"ttft"
"""Parquet key-value metadata key holding the run metadata (a JSON object)."""

INPUTS_KEY: Final[bytes] = b"ttft.inputs"
"""Schema metadata key of a table read from several runs or an unfinished one: what was read
(a JSON list; see `read_inputs`). Never written to a file."""

OWN_ROWS_KEY: Final[bytes] = b"ttft.own_rows"
"""Schema metadata key of one partition of a dataset read alone (``read_spans(path,
partition=k)``): how many of its leading rows it owns (a decimal count); the rows after
them are copies of the step traces its requests joined, owned by other partitions. Never
written to a file."""


def run_metadata(table: pa.Table | pa.Schema) -> dict[str, Any]:
    """The run metadata under `METADATA_KEY` of a table's schema: the one reader of it
    (empty when absent, not JSON or not a JSON object)."""
    import pyarrow as pa

    schema = table if isinstance(table, pa.Schema) else table.schema
    raw = (schema.metadata or {}).get(METADATA_KEY)
    try:
        value = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def read_inputs(table: pa.Table) -> list[dict[str, Any]] | None:
    """What ``read_spans`` read to make ``table``, when it was a directory of runs or an
    unfinished run (a writer's parts and log): per run its ``path``, ``state``
    (``finished`` or ``unfinished``) and ``spans``, and for an unfinished run its ``parts``,
    ``log_segments``, ``log_records`` and ``torn_bytes`` (an incomplete last record, left
    out); None for a single finished file or another format."""
    raw = (table.schema.metadata or {}).get(INPUTS_KEY)
    return json.loads(raw) if raw else None


def with_run_metadata(table: pa.Table, metadata: Mapping[str, Any]) -> pa.Table:
    """``table`` with ``metadata`` as its run metadata (`METADATA_KEY`; its other schema
    metadata kept): the one writer of it on a table."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                          METADATA_KEY: json.dumps(metadata).encode()})


# --- several runs' metadata as one --------------------------------------------------------
# Run metadata of several runs or inputs read as one trace: the defects each run counted
# (spans an importer or a collector rejected, intervals a source estimated, events an
# importer skipped) are summed over all of them, so no run's counts stand for all.

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


def newest_run_metadata(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run metadata of several runs of one recording read as one trace (a directory of
    runs, a dataset and its staged runs): the newest's (the last of ``runs``), with the
    defects every run counted summed (`counted_sums`): spans one run's collector rejected
    are not lost because a later run rejected none."""
    newest = {k: v for k, v in runs[-1].items() if k not in (*COUNTED, SKIPPED)}
    return {**newest, **counted_sums(runs)}


@cache
def _span_schema() -> pa.Schema:
    import pyarrow as pa

    names = pa.dictionary(pa.int32(), pa.string())
    return pa.schema(
        [
            pa.field("trace_id", pa.string(), nullable=False),
            pa.field("span_id", pa.string()),
            pa.field("parent_id", pa.string()),
            pa.field("request_id", pa.string()),
            pa.field("name", pa.string(), nullable=False),
            pa.field("stage", names, nullable=False),
            pa.field("start_ns", pa.int64(), nullable=False),
            pa.field("end_ns", pa.int64(), nullable=False),
            pa.field("clock", names, nullable=False),
            pa.field("service", names, nullable=False),
            pa.field("attributes", pa.string()),
        ]
    )


@cache
def _span_schema_v2() -> pa.Schema:
    import pyarrow as pa

    v1 = _span_schema()
    ids = {"trace_id": pa.field("trace_id", pa.binary(16), nullable=False),
           "span_id": pa.field("span_id", pa.binary(8)),
           "parent_id": pa.field("parent_id", pa.binary(8))}
    return pa.schema([ids.get(f.name, f) for f in v1])


def __getattr__(name: str) -> Any:
    """``SPAN_SCHEMA`` and ``SPAN_SCHEMA_V2``, made (and pyarrow imported) on first use
    (PEP 562), so a command that only reads the names here (``ttft --help``) never loads
    pyarrow."""
    if name == "SPAN_SCHEMA":
        return _span_schema()
    if name == "SPAN_SCHEMA_V2":
        return _span_schema_v2()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    SPAN_SCHEMA: Final[pa.Schema] = _span_schema()
    SPAN_SCHEMA_V2: Final[pa.Schema] = _span_schema_v2()
"""One row per span or point event (``SPAN_SCHEMA``, an Arrow schema); see docs/design.md
for the meaning of each column. ``SPAN_SCHEMA_V2`` is the same row with its ids as bytes:
``trace_id`` 16, ``span_id`` and ``parent_id`` 8 (what files are written in, and what the
analysis reads them as; ``tracer.span_ids``)."""

COLUMNS: Final[tuple[str, ...]] = (
    "trace_id", "span_id", "parent_id", "request_id", "name", "stage", "start_ns", "end_ns",
    "clock", "service", "attributes",
)  # fmt: skip
"""``SPAN_SCHEMA``'s column names, in order."""


@dataclass(frozen=True)
class Stage:
    """One canonical stage.

    Attributes:
        name: the value stored in the ``stage`` column.
        level: ``request`` (lives in the request's trace), ``engine`` (serves many
            requests, lives in the engine's trace), ``derived`` (made by analysis) or
            ``any``.
        priority: exclusive-attribution priority; higher wins a contested segment.
            ``None`` for stages that never take window time themselves.
        meaning: one line for help texts and reports.
    """

    name: str
    level: str
    priority: int | None
    meaning: str


STAGES: Final[tuple[Stage, ...]] = (
    Stage("client", "request", 1, "client span: request handed to the HTTP client to last byte"),
    Stage("connect", "request", 2, "TCP/TLS connect when a new connection was opened"),
    Stage("server", "request", 3, "request at the server, received to response end"),
    Stage("route", "request", 5, "a gateway or router choosing the endpoint that serves the "
          "request (admission, filters, scorers, prefix-cache lookups, the pick)"),
    Stage("tokenize", "request", 12, "prompt to token ids"),
    Stage("queue", "request", 6, "waiting for admission into the running batch"),
    Stage("schedule", "request", 8, "scheduler CPU work of the iteration admitting the request"),
    Stage("batch_wait", "request", 7, "admitted, waiting for its first prefill chunk to start"),
    Stage("prefill", "request", 5, "envelope from the first prefill chunk to the last"),
    Stage("prefill.chunk", "request", 15, "an iteration that carried a chunk of the prompt"),
    Stage("preempted", "request", 6, "preempted (its K/V blocks freed for another request) "
          "until admitted again to recompute"),
    Stage("sample", "request", 13, "logits of the last prompt position to the first token id"),
    Stage("detokenize", "request", 12, "first token id to text"),
    Stage("holdback", "request", 11, "first text held back (split UTF-8, stop-string prefix)"),
    Stage("deliver", "request", 10, "a ready token waiting for the event loop before its send"),
    Stage("kv_transfer", "request", 14, "disaggregated serving: first K/V block sent by the "
          "prefill worker to the last installed by the decode worker"),
    Stage("stream", "request", 9, "writing the first body chunk that carries a token"),
    Stage("step", "engine", None, "one engine iteration (used by blame, never takes time)"),
    Stage("forward", "engine", 16, "host side of one forward pass"),
    Stage("gpu", "engine", 17, "device execution of a forward pass, on the host clock"),
    Stage("network", "derived", None, "client window outside the server's own window"),
    Stage("untraced", "derived", None, "client window of a request without a server window: "
          "the server and the network together, unseen (no server span came)"),
    Stage("unattributed", "derived", None, "window time that no span covers"),
    Stage("other", "any", 4, "a span whose stage is not known"),
    Stage("event", "any", None, "a point event (start_ns == end_ns)"),
)
"""The stage vocabulary of docs/design.md, in the order a request meets them; priorities encode
the exclusive order ``gpu > forward > prefill.chunk > kv_transfer > sample > detokenize =
tokenize > holdback > deliver > stream > schedule > batch_wait > queue = preempted > prefill =
route > other > server > connect > client`` (docs/attribution.md, "Stages and their order")."""

STAGE_BY_NAME: Final[dict[str, Stage]] = {s.name: s for s in STAGES}
STAGE_NAMES: Final[tuple[str, ...]] = tuple(s.name for s in STAGES)
PRIORITY: Final[dict[str, int]] = {s.name: s.priority for s in STAGES if s.priority is not None}
REQUEST_STAGES: Final[frozenset[str]] = frozenset(s.name for s in STAGES if s.level == "request")
ENGINE_STAGES: Final[frozenset[str]] = frozenset(s.name for s in STAGES if s.level == "engine")
DERIVED_STAGES: Final[frozenset[str]] = frozenset(("network", "untraced", "unattributed"))

# Event names (rows with stage "event"; the name column holds the event name).
EV_FIRST_TOKEN: Final = "first_token"
"""client: first chunk with non-empty ``text`` or ``delta.content`` received."""
EV_FIRST_BYTE: Final = "first_byte"
"""server: end of the ``stream`` span, the first body chunk carrying a token handed over."""
EV_FIRST_SAMPLED: Final = "first_sampled"
"""engine: first token id sampled."""
EV_TOKEN: Final = "token"
"""client: each later token (or chunk of tokens) received after ``first_token``."""
EV_FIRST_REASONING: Final = "first_reasoning"
"""client: first chunk with non-empty ``delta.reasoning_content`` (or ``reasoning``)."""
CLIENT_EVENTS: Final[tuple[str, ...]] = (
    "scheduled",
    "sent",
    "headers",
    "first_chunk",
    "first_event",
    "role_chunk",
    EV_FIRST_TOKEN,
    EV_TOKEN,
    EV_FIRST_REASONING,
)
BOUNDARY_EVENTS: Final[tuple[str, ...]] = (EV_FIRST_TOKEN, EV_FIRST_BYTE, EV_FIRST_SAMPLED)

# Attribute keys that analysis reads from the JSON ``attributes`` column.
ATTR_STEP_ID: Final = "step_id"
ATTR_CACHED_TOKENS: Final = "cached_tokens"
ATTR_PROMPT_TOKENS: Final = "prompt_tokens"
ATTR_CHUNK_TOKENS: Final = "chunk_tokens"
ATTR_CONTEXT_TOKENS: Final = "context_tokens"
ATTR_REQUEST_IDS: Final = "request_ids"
ATTR_PREFILL_TOKENS: Final = "prefill_tokens"
ATTR_DECODE_TOKENS: Final = "decode_tokens"
ATTR_KV_BLOCKS: Final = "ttft.kv.blocks"
"""``kv_transfer``: the K/V blocks the transfer carried (an int)."""
ATTR_KV_BYTES: Final = "ttft.kv.bytes"
"""``kv_transfer``: the bytes the transfer carried, all layers, K and V (an int). The span
runs from the first block sent to the last block installed, so the achieved bandwidth is
``bytes * 1e9 / (end_ns - start_ns)`` bytes/s (undefined for a span of no length)."""
ATTR_KV_FIRST_TOKEN: Final = "ttft.kv.first_token"
"""``kv_transfer``: which side of a disaggregated engine delivered the request's first
token, ``"decode"`` (after the transfer: TTFT includes it) or ``"prefill"`` (before it)."""
ATTR_ESTIMATED: Final = "ttft.estimated"
"""A span whose interval the source estimated rather than measured: the attribute's text
says how (Dynamo's ``kv_transfer_estimated_latency_ms``, an upper bound); ``true`` also
marks one, ``false`` or an empty text does not."""
ATTR_STAGE: Final = "ttft.stage"
"""OpenTelemetry span attribute naming the stage explicitly."""
ATTR_REQUEST_ID: Final = "ttft.request_id"
"""OpenTelemetry span attribute holding the serving stack's request id."""
ATTR_CLOCK: Final = "ttft.clock"
"""OpenTelemetry span attribute naming the clock domain (default ``host:<hostname>``)."""

CLIENT_CLOCK: Final = "client"
"""The ``clock`` value of spans measured by the client (load generator)."""

CONDITIONS: Final[tuple[str, ...]] = ("cold", "prefix_hit")

# Request outcomes (docs/design.md, "TTFT windows"): the client span's ``outcome`` attribute.
OUTCOME_OK: Final = "ok"
OUTCOME_CANCELLED: Final = "cancelled"
OUTCOMES: Final[tuple[str, ...]] = (
    OUTCOME_OK,
    "http_error",
    "shed",
    "timeout",
    "disconnected",
    "aborted",
    "truncated",
    "client_error",
    OUTCOME_CANCELLED,
)
"""``ok``: a 200 whose stream completed its framing with ``[DONE]`` or a finish reason, and
whose finish reason is not a failure: ``stop``, ``length``, ``tool_calls``,
``function_call``, ``content_filter`` (counted apart: ``FINISH_CONTENT_FILTER``) or a
string not known to mean one (kept in ``ATTR_FINISH_REASON``); ``http_error``: another
status, or an error or unreadable event in the stream (with the status); ``shed``: 429 or
503; ``timeout``: the client's limit ran out; ``disconnected``: the connection closed or the
stream ended before completing its framing or a finish reason; ``aborted``: the server
ended the stream with finish reason ``abort`` or ``error`` (vLLM), or an object-valued one
(SGLang's ``{"type": "abort", ...}``) whose ``type`` is not ``stop`` or ``length``;
``truncated``: the stream ended with ``[DONE]`` but no choice ever carried a finish reason
(a server that cut the answer short; docs/attribution.md, "Outcomes from the stream's
end"); ``client_error``: the request could not be sent (no connection); ``cancelled``:
the run stopped (Ctrl-C, SIGTERM) while the request was in flight, so its client span
ends there. A cancelled request is an outcome of the run, not a defect of its data: the
server spans it left (a ``server`` span that never ended, children without it) are not
counted as data-quality defects."""
ATTR_OUTCOME: Final = "outcome"
ATTR_STATUS_CODE: Final = "status_code"
ATTR_ERROR: Final = "error"
ATTR_FINISH_REASON: Final = "finish_reason"
"""The client span's finish reason, as the stream's end gave it (an object-valued one: its
``type``); absent when no choice carried one."""
FINISH_CONTENT_FILTER: Final = "content_filter"
"""The finish reason of an ``ok`` request whose answer the server's content filter ended:
counted apart (``ttft analyze --json``: ``load.content_filter``)."""
REPORTED_SERVICE: Final = "server-reported"
"""The ``service`` of the spans the load generator places from the timings a server reported
in its response (``collectors.server_timings``): on the ``client`` clock, children of the
client span, each marked ``ATTR_ESTIMATED``. Analysis attributes them only in a request
without measured server-side spans (docs/attribution.md, "Server-reported timings")."""


@dataclass(frozen=True)
class Boundary:
    """Where a TTFT window starts and ends (docs/design.md, "TTFT windows")."""

    name: str
    start: str
    end: str
    root: str


BOUNDARIES: Final[tuple[Boundary, ...]] = (
    Boundary("client", "start of the client span", "the first_token event", "the client span"),
    Boundary("server", "start of the server span", "the first_byte event", "the server span"),
    Boundary(
        "engine",
        "start of tokenize (else queue)",
        "first_sampled (else end of the first sample)",
        "a virtual root covering the window",
    ),
)
"""Outermost first: the default boundary of a trace is the first one that at least one of
its requests supports."""
BOUNDARY_NAMES: Final[tuple[str, ...]] = tuple(b.name for b in BOUNDARIES)
POLICIES: Final[tuple[str, ...]] = ("exclusive", "shared", "critical-path")

ROOT_ONLY_STAGE: Final[dict[str, str]] = {
    "client": "network",
    "server": "server",
    "engine": "unattributed",
}
"""The stage that receives window time covered by the window's root alone; at the client
boundary, a request without a server window gives it to ``untraced`` instead
(`root_only_stage`)."""


def root_only_stage(boundary: str, server_window: bool = True) -> str:
    """The stage of a request's root-only time at ``boundary``: ``network`` is the client
    window minus a known server window, so a request the server left no ``server`` span in
    has ``untraced`` time (the server's and the network's together) instead."""
    if boundary == "client" and not server_window:
        return "untraced"
    return ROOT_ONLY_STAGE[boundary]


def stage_of(name: str) -> str:
    """Map a span name to a canonical stage: the name itself if it is one, else ``other``."""
    return name if name in STAGE_BY_NAME else "other"


def empty_table() -> pa.Table:
    """A table with the span schema and no rows."""
    return _span_schema().empty_table()
