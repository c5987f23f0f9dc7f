"""Synthetic traces whose TTFT attribution is known in advance.

`generate` lays out a workload with numpy (no Python loop per request) and returns the span
table together with the attribution every policy must give, computed from the layout by
arithmetic, never by calling ``ttft.analysis``: an independent check of the analyzer
(docs/attribution.md) and a benchmark input of any size. The layout is drawn by
``_synthetic_layout``; the columns follow the row builder's rules (``ttft.collectors.rows``:
point-event span ids, compact sorted JSON attributes) and pass ``to_span_table`` as every
producer's rows do.

Layout of one request (all times int64 epoch ns; client and server clocks share one epoch,
and the network delay ``d`` is the same in both directions, so clock alignment finds 0):

- client trace, clock ``client``, service ``loadgen``: ``client`` root from send to last
  byte; ``connect`` child at its start for a quarter of the requests; events ``scheduled``
  (at or before the client start), ``sent``, ``headers``, ``first_chunk`` = ``first_token``
  (= ``first_byte + d``) and three ``token`` events, all children of the client span.
- server spans in the same trace, clock ``host:synth``, service ``engine``, ``request_id``
  on each: ``server`` (child of ``client``, from ``sent + d`` to after the last token) and
  its children in sequence, siblings never overlapping: ``tokenize`` (absent for 5 %, then the
  engine window starts at ``queue``), an uncovered gap for a quarter of the requests,
  ``queue``, ``schedule``, ``prefill`` (envelope over 1-3 ``prefill.chunk`` children with
  3-30 ms gaps between them), ``sample``, ``detokenize``, ``stream``; events
  ``first_sampled`` (end of ``sample``) and ``first_byte`` (end of ``stream``).
- engine trace per cohort: 1-4 consecutive arrivals are admitted together and share their
  chunk iterations. Each chunk iteration is a ``step`` root with a ``forward`` child and a
  ``gpu`` grandchild (clock ``gpu:0``, joined to the chunks by ``step_id``); the previous
  cohort decodes in those steps and in a decode-only ``step`` in every gap between chunks.
  A ``gpu`` span starts inside its chunk and ends before it, except for the last chunk,
  where it outlasts the chunk by ``ov`` and overlaps the beginning of ``sample`` (which is
  always longer).

So the one contested interval is ``[last chunk end, + ov)``: ``exclusive`` gives it to
``gpu``, ``shared`` splits it (``gpu`` takes the odd nanosecond), ``critical-path`` clips
``gpu`` to its chunk and gives it to ``sample``. Everything else has one most specific
span: gaps between chunks are ``prefill``, server time outside its children is ``server``
(``unattributed`` in the engine window), client time outside ``connect`` and the server
window is ``network``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ttft.collectors._spans import to_span_table
from ttft.collectors._synthetic_columns import (
    hex64,
    hex_strings,
    id_lists,
    json_object,
    key,
    repeat,
    request_ids,
    trace_hex,
)
from ttft.collectors._synthetic_layout import (
    CHUNK_BUDGET_TOKENS,
    PREFIX_HIT_FRACTION,
    RATE_PER_S,
    layout,
)
from ttft.collectors.rows import event_span_ids, mix64
from ttft.tracer.schema import (
    ATTR_CACHED_TOKENS,
    ATTR_CHUNK_TOKENS,
    ATTR_CONTEXT_TOKENS,
    ATTR_DECODE_TOKENS,
    ATTR_PREFILL_TOKENS,
    ATTR_PROMPT_TOKENS,
    ATTR_REQUEST_IDS,
    ATTR_STEP_ID,
    BOUNDARY_NAMES,
    CLIENT_CLOCK,
    EV_FIRST_BYTE,
    EV_FIRST_SAMPLED,
    EV_FIRST_TOKEN,
    EV_TOKEN,
    POLICIES,
    SPAN_SCHEMA,
    STAGE_NAMES,
    stage_of,
    with_run_metadata,
)

GENERATOR = "ttft.collectors.synthetic"
HOST_CLOCK = "host:synth"
GPU_CLOCK = "gpu:0"
_BLOCK_COHORTS = 65_536
_SLOTS = 32  # span-id slots per request or cohort

# Span kinds: (name, clock, service); the stage is stage_of(name), or "event".
_EVENT_NAMES = ("scheduled", "sent", "headers", "first_chunk", EV_FIRST_TOKEN, EV_TOKEN,
                EV_FIRST_SAMPLED, EV_FIRST_BYTE)
_KINDS = (
    ("client", CLIENT_CLOCK, "loadgen"), ("connect", CLIENT_CLOCK, "loadgen"),
    *((e, CLIENT_CLOCK, "loadgen") for e in _EVENT_NAMES[:6]),
    *((s, HOST_CLOCK, "engine") for s in ("server", "tokenize", "queue", "schedule", "prefill",
                                          "prefill.chunk", "sample", "detokenize", "stream")),
    *((e, HOST_CLOCK, "engine") for e in _EVENT_NAMES[6:]),
    ("step", HOST_CLOCK, "engine"), ("forward", HOST_CLOCK, "engine"), ("gpu", GPU_CLOCK, "engine"),
)
_KIND = {k[0]: i for i, k in enumerate(_KINDS)}
_NAMES = pa.array([k[0] for k in _KINDS])
_STAGES = pa.array(STAGE_NAMES)
_CLOCKS = pa.array([CLIENT_CLOCK, HOST_CLOCK, GPU_CLOCK])
_SERVICES = pa.array(["loadgen", "engine"])
_STAGE_CODE = np.array([STAGE_NAMES.index("event" if k[0] in _EVENT_NAMES else stage_of(k[0]))
                        for k in _KINDS], np.int32)
_CLOCK_CODE = np.array([_CLOCKS.to_pylist().index(k[1]) for k in _KINDS], np.int32)
_SERVICE_CODE = np.array([_SERVICES.to_pylist().index(k[2]) for k in _KINDS], np.int32)
# Request slots: client 0, connect 1, client events 2-9, server 10 ... first_byte 22.
_SLOT = {"client": 0, "connect": 1, **{e: 2 + i for i, e in enumerate(_EVENT_NAMES[:5])},
         EV_TOKEN: 7, "server": 10, "tokenize": 11, "queue": 12, "schedule": 13, "prefill": 14,
         "prefill.chunk": 15, "sample": 18, "detokenize": 19, "stream": 20,
         EV_FIRST_SAMPLED: 21, EV_FIRST_BYTE: 22}

@dataclass
class SyntheticTrace:
    """A generated trace and the attribution every analyzer must reproduce.

    Attributes:
        table: the spans, exactly `SPAN_SCHEMA`.
        metadata: the workload description (generator, requests, seed, rates).
        expected: (computed on first access) one row per request x boundary x policy x
            stage with non-zero time: ``trace_id, request_id, boundary, policy, stage``
            (categoricals) and ``attributed_ns`` (int64). Each (request, boundary, policy)
            group sums to that window's length.
    """

    table: pa.Table
    metadata: dict
    _parts: dict[str, np.ndarray] = field(repr=False, compare=False)
    _seed: int = field(default=0, repr=False, compare=False)

    @cached_property
    def expected(self) -> pd.DataFrame:
        return _expected(self._parts, self._seed)


def generate(requests: int = 1000, *, seed: int = 0) -> SyntheticTrace:
    """Lay out ``requests`` requests (Poisson arrivals at `RATE_PER_S`), deterministic per seed."""
    if requests < 1:
        raise ValueError(f"requests must be at least 1, got {requests}")
    lay = layout(requests, seed)
    batches = [_block(lay, c0, min(c0 + _BLOCK_COHORTS, lay["m"]))
               for c0 in range(0, lay["m"], _BLOCK_COHORTS)]
    table = to_span_table(pa.Table.from_batches(batches, schema=SPAN_SCHEMA))
    metadata = {
        "generator": GENERATOR, "requests": requests, "seed": seed,
        "rate_per_s": RATE_PER_S, "prefix_hit_fraction": PREFIX_HIT_FRACTION,
        "chunk_budget_tokens": CHUNK_BUDGET_TOKENS, "engine_traces": int(lay["m"]),
        "prefix_hits": int((lay["cached"] > 0).sum()), "rows": table.num_rows,
    }
    return SyntheticTrace(table=table, metadata=metadata, _parts=lay["parts"], _seed=seed)


def expected_path(trace_path: str | Path) -> Path:
    """Where the expected attribution of a trace file lives: ``demo.parquet`` ->
    ``demo.expected.parquet`` (a directory of parts ``demo`` -> ``demo.expected.parquet``)."""
    path = Path(trace_path)
    stem = path.stem if path.suffix == ".parquet" else path.name
    return path.with_name(f"{stem}.expected.parquet")


def write_expected(synth: SyntheticTrace, path: str | Path) -> Path:
    """Write ``synth.expected`` to exactly ``path`` as Parquet, with the workload metadata
    under `METADATA_KEY`; returns the path."""
    table = pa.Table.from_pandas(synth.expected, preserve_index=False)
    pq.write_table(with_run_metadata(table, synth.metadata), path)
    return Path(path)


def _block(lay: dict, c_lo: int, c_hi: int) -> pa.RecordBatch:
    """The rows of cohorts ``[c_lo, c_hi)``: their requests' traces and their engine traces."""
    starts = lay["starts"]
    r = np.arange(starts[c_lo], starts[c_hi])
    ids = request_ids(r)
    rows: list[tuple] = []

    def add(kind: str, ent: np.ndarray, slot, parent, start: np.ndarray, end: np.ndarray,
            rid: bool = True, attrs: pa.Array | None = None, event: int = -1) -> None:
        """``event``: a point event's index among its parent's events (-1: a span)."""
        size = len(ent)
        rows.append((np.full(size, _KIND[kind], np.int32), ent, np.broadcast_to(slot, size),
                     np.broadcast_to(parent, size), start, end, np.full(size, event),
                     pc.take(ids, ent - r[0]) if rid else pa.nulls(size, pa.string()),
                     attrs if attrs is not None else repeat("{}", size)))

    def req(name: str, start: np.ndarray, end: np.ndarray, parent: int, attrs=None) -> None:
        add(name, r, _SLOT[name], parent, start, end, attrs=attrs)

    g = {key: lay[key][r] for key in ("c0", "wait", "conn", "sent", "s", "t0", "tok", "q0", "se",
                                       "det", "fb", "ft", "d", "tail", "cached", "prompt")}
    c = lay["cohort"][r]
    cl, sv = _SLOT["client"], _SLOT["server"]
    token_ns = lay["token_ns"][r]
    client_end = token_ns[:, 2] + g["tail"]
    req("client", g["c0"], client_end, -1)
    m = g["conn"] > 0
    add("connect", r[m], _SLOT["connect"], cl, g["c0"][m], (g["c0"] + g["conn"])[m], rid=False)
    client_events = (("scheduled", g["c0"] - g["wait"]), ("sent", g["sent"]),
                     ("headers", g["s"] + g["t0"] + g["d"]), ("first_chunk", g["ft"]),
                     (EV_FIRST_TOKEN, g["ft"]))
    for i, (name, at) in enumerate(client_events):
        add(name, r, _SLOT[name], cl, at, at, rid=False, event=i)
    for i in range(3):
        add(EV_TOKEN, r, _SLOT[EV_TOKEN] + i, cl, token_ns[:, i], token_ns[:, i], rid=False,
            event=len(client_events) + i)

    req("server", g["s"], client_end - g["d"], cl,
        json_object({ATTR_PROMPT_TOKENS: g["prompt"], ATTR_CACHED_TOKENS: g["cached"]}))
    m = lay["has_tok"][r]
    tok_start = g["s"] + g["t0"]
    add("tokenize", r[m], _SLOT["tokenize"], sv, tok_start[m], (tok_start + g["tok"])[m],
        attrs=json_object({ATTR_PROMPT_TOKENS: g["prompt"][m]}))
    q1, cs, ce = lay["q1"][c], lay["cs"][c], lay["ce"][c]
    pe = ce[np.arange(len(r)), lay["k"][c] - 1]
    req("queue", g["q0"], q1, sv)
    req("schedule", q1, cs[:, 0], sv)
    req("prefill", cs[:, 0], pe, sv)
    step0 = lay["step0"]
    for i in range(3):
        m = lay["live"][c, i]
        attrs = json_object({ATTR_STEP_ID: (step0[c] + 2 * i)[m],
                       ATTR_CHUNK_TOKENS: lay["tokens"][r[m], i],
                       ATTR_CACHED_TOKENS: g["cached"][m],
                       ATTR_CONTEXT_TOKENS: lay["context"][r[m], i]})
        add("prefill.chunk", r[m], _SLOT["prefill.chunk"] + i, _SLOT["prefill"], cs[m, i], ce[m, i],
            attrs=attrs)
    req("sample", pe, g["se"], sv)
    req("detokenize", g["se"], g["se"] + g["det"], sv)
    req("stream", g["se"] + g["det"], g["fb"], sv)
    add(EV_FIRST_SAMPLED, r, _SLOT[EV_FIRST_SAMPLED], _SLOT["sample"], g["se"], g["se"], event=0)
    add(EV_FIRST_BYTE, r, _SLOT[EV_FIRST_BYTE], _SLOT["stream"], g["fb"], g["fb"], event=0)

    # Engine traces, one per cohort: the previous cohort decodes while this one prefills.
    # Slots: chunk step i at 6i (forward 6i + 1, gpu 6i + 2), decode step after it at 6i + 3.
    coh = np.arange(c_lo, c_hi)
    ent = lay["n"] + coh
    prev_lo = starts[np.maximum(coh - 1, 0)]
    prev_n = starts[coh] - prev_lo
    batch = id_lists(prev_lo, starts[coh + 1])
    live = lay["live"][coh]
    cs, ce = lay["cs"][coh], lay["ce"][coh]
    for i in range(3):
        m = live[:, i]
        sid = (step0[coh] + 2 * i)[m]
        add("step", ent[m], 6 * i, -1, cs[m, i], ce[m, i], False, json_object({
            ATTR_STEP_ID: sid, ATTR_REQUEST_IDS: batch.filter(pa.array(m)),
            ATTR_PREFILL_TOKENS: lay["prefill_tokens"][coh[m], i], ATTR_DECODE_TOKENS: prev_n[m]}))
        add("forward", ent[m], 6 * i + 1, 6 * i, lay["fs"][coh[m], i], lay["fe"][coh[m], i], False,
            json_object({ATTR_STEP_ID: sid}))
        add("gpu", ent[m], 6 * i + 2, 6 * i + 1, lay["gs"][coh[m], i], lay["ge"][coh[m], i], False,
            json_object({ATTR_STEP_ID: sid}))
    for i in range(2):
        m = live[:, i + 1] & (coh > 0)
        gap = lay["gap"][coh[m], i]
        add("step", ent[m], 6 * i + 3, -1, ce[m, i] + gap // 10, cs[m, i + 1] - gap // 10, False,
            json_object({ATTR_STEP_ID: (step0[coh] + 2 * i + 1)[m],
                   ATTR_REQUEST_IDS: id_lists(prev_lo[m], starts[coh[m]]),
                   ATTR_PREFILL_TOKENS: np.zeros(int(m.sum()), np.int64),
                   ATTR_DECODE_TOKENS: prev_n[m]}))
    return _batch(rows, np.concatenate([r, ent]), len(r), lay["seed"])


def _batch(rows: list[tuple], entities: np.ndarray, split: int, seed: int) -> pa.RecordBatch:
    """One record batch. ``entities``: the block's traces, requests (a contiguous range of
    ``split``) then engine traces (another contiguous range). A span's id is a bijection
    of its (entity, slot) counter; a point event's is ``rows.event_span_ids`` of its
    parent's id and its index, as every producer of span rows derives it."""
    kind, ent, slot, parent, start, end, event = (np.concatenate([row[j] for row in rows])
                                                  for j in range(7))
    is_req = ent < entities[split]
    local = np.where(is_req, ent - entities[0], ent - entities[split] + split)
    ent = ent.astype(np.uint64)
    has_parent = parent >= 0
    ids_key = key(seed, 0)
    span_ids = mix64((ent * _SLOTS + slot.astype(np.uint64)) ^ ids_key)
    parent_ids = mix64((ent * _SLOTS + np.maximum(parent, 0).astype(np.uint64)) ^ ids_key)
    is_event = event >= 0
    span_ids[is_event] = event_span_ids(parent_ids[is_event], event[is_event])
    arrays = [
        hex_strings(np.take(trace_hex(entities.astype(np.uint64), seed), local, axis=0)),
        hex_strings(hex64(span_ids)),
        hex_strings(hex64(parent_ids[has_parent]), has_parent),
        pa.concat_arrays([row[7] for row in rows]),
        _NAMES.take(pa.array(kind)),
        pa.DictionaryArray.from_arrays(pa.array(_STAGE_CODE[kind]), _STAGES),
        pa.array(start, pa.int64()),
        pa.array(end, pa.int64()),
        pa.DictionaryArray.from_arrays(pa.array(_CLOCK_CODE[kind]), _CLOCKS),
        pa.DictionaryArray.from_arrays(pa.array(_SERVICE_CODE[kind]), _SERVICES),
        pa.concat_arrays([row[8] for row in rows]),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=SPAN_SCHEMA)


def _expected(parts: dict[str, np.ndarray], seed: int, block: int = 131_072) -> pd.DataFrame:
    """Per (request, boundary, policy, stage) the attributed time the layout implies."""
    stages = ("network", "connect", "server", "unattributed", "tokenize", "queue", "schedule",
              "prefill", "prefill.chunk", "gpu", "sample", "detokenize", "stream")
    gpu_in, ov, sample = parts["gpu_in"], parts["ov"], parts["sample"]
    gpu_sample = {  # the gpu tail after the last chunk overlaps sample
        "exclusive": (gpu_in + ov, sample - ov),
        "shared": (gpu_in + ov - ov // 2, sample - ov + ov // 2),
        "critical-path": (gpu_in, sample),
    }
    combos, columns = [], []
    for b, boundary in enumerate(BOUNDARY_NAMES):
        for p, policy in enumerate(POLICIES):
            for s, stage in enumerate(stages):
                if (boundary != "client" and stage in ("network", "connect")
                        or boundary == "engine" and stage in ("server", "detokenize", "stream")
                        or boundary != "engine" and stage == "unattributed"):
                    continue
                if stage in ("gpu", "sample"):
                    value = gpu_sample[policy][stage == "sample"]
                else:
                    value = parts[stage]
                combos.append((b, p, s))
                columns.append(value)
    codes = np.array(combos, np.int8).T  # (3, combos): boundary, policy, stage
    n = len(gpu_in)
    out: list[list[np.ndarray]] = [[], [], [], [], []]  # request, boundary, policy, stage, ns
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        matrix = np.empty((hi - lo, len(columns)), np.int64)
        for j, col in enumerate(columns):
            matrix[:, j] = col[lo:hi]
        mask = matrix != 0
        out[0].append(np.repeat(np.arange(lo, hi, dtype=np.int32), mask.sum(axis=1)))
        for i in range(3):
            out[i + 1].append(np.broadcast_to(codes[i], mask.shape)[mask])
        out[4].append(matrix[mask])
    req, boundary, policy, stage, value = (np.concatenate(o) for o in out)
    del out
    trace_ids = hex_strings(trace_hex(np.arange(n, dtype=np.uint64), seed))
    cat = pd.Categorical.from_codes
    return pd.DataFrame({
        "trace_id": cat(req, categories=pd.Index(trace_ids.to_numpy(zero_copy_only=False))),
        "request_id": cat(req, categories=pd.Index(
            request_ids(np.arange(n)).to_numpy(zero_copy_only=False))),
        "boundary": cat(boundary, categories=list(BOUNDARY_NAMES)),
        "policy": cat(policy, categories=list(POLICIES)),
        "stage": cat(stage, categories=list(stages)),
        "attributed_ns": value,
    }, copy=False)
