"""Synthetic traces whose TTFT attribution is known in advance.

`generate` lays out a workload with numpy (no Python loop per request) and returns the span
table together with the attribution every policy must give, computed from the layout by
arithmetic, never by calling ``ttft.analysis``: an independent check of the analyzer
(docs/attribution.md) and a benchmark input of any size.

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

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ttft.collectors._synthetic_columns import (
    hex_strings,
    id_lists,
    json_object,
    repeat,
    request_ids,
    span_hex,
    trace_hex,
)
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
    METADATA_KEY,
    POLICIES,
    SPAN_SCHEMA,
    STAGE_NAMES,
    stage_of,
)

GENERATOR = "ttft.collectors.synthetic"
RATE_PER_S = 20.0
PREFIX_HIT_FRACTION = 0.3
CHUNK_BUDGET_TOKENS = 1024
HOST_CLOCK = "host:synth"
GPU_CLOCK = "gpu:0"
_T0_NS = 1_700_000_000_000_000_000
_BLOCK_COHORTS = 65_536
_SLOTS = 32  # span-id slots per request or cohort
_MS = 1_000_000
_US = 1_000

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
    lay = _layout(requests, seed)
    batches = [_block(lay, c0, min(c0 + _BLOCK_COHORTS, lay["m"]))
               for c0 in range(0, lay["m"], _BLOCK_COHORTS)]
    table = pa.Table.from_batches(batches, schema=SPAN_SCHEMA)
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
    meta = {**(table.schema.metadata or {}), METADATA_KEY: json.dumps(synth.metadata).encode()}
    pq.write_table(table.replace_schema_metadata(meta), path)
    return Path(path)


def _layout(n: int, seed: int) -> dict:
    """Draw every duration and place every interval; no Arrow yet."""
    rng = np.random.default_rng(seed)

    def uni(lo: int, hi: int, size: int | tuple[int, int]) -> np.ndarray:
        return rng.integers(lo, hi, size, endpoint=True, dtype=np.int64)

    # Cohorts: consecutive arrivals admitted together, sharing their chunk iterations.
    sizes = rng.choice(np.arange(1, 5), size=n, p=[0.4, 0.3, 0.2, 0.1])
    m = int(np.searchsorted(np.cumsum(sizes), n)) + 1
    sizes = sizes[:m]
    sizes[-1] -= sizes.sum() - n
    starts = np.zeros(m + 1, np.int64)
    starts[1:] = np.cumsum(sizes)
    cohort = np.repeat(np.arange(m), sizes)
    k = rng.choice(np.arange(1, 4), size=m, p=[0.5, 0.3, 0.2])
    chunk = np.arange(3)
    live = chunk < k[:, None]  # (m, 3): chunk i exists
    step0 = np.cumsum(2 * k - 1) - (2 * k - 1)  # chunk i: step step0 + 2i; gap after it: + 1

    # Prompts: the uncached part fills k chunks of at most CHUNK_BUDGET_TOKENS.
    uncached = (k[cohort] - 1) * CHUNK_BUDGET_TOKENS + uni(16, CHUNK_BUDGET_TOKENS, n)
    cached = np.where(rng.random(n) < PREFIX_HIT_FRACTION, 16 * uni(4, 256, n), 0)
    tokens = np.clip(uncached[:, None] - chunk * CHUNK_BUDGET_TOKENS, 0, CHUNK_BUDGET_TOKENS)
    context = cached[:, None] + np.cumsum(tokens, axis=1)  # positions the chunk attends to
    prefill_tokens = np.add.reduceat(tokens, starts[:-1], axis=0)
    attention = np.add.reduceat(tokens * context, starts[:-1], axis=0)

    # Client and the server up to the end of queueing.
    c0 = _T0_NS + np.cumsum(rng.exponential(1e9 / RATE_PER_S, n)).astype(np.int64)
    wait = np.where(rng.random(n) < 0.3, uni(100 * _US, 20 * _MS, n), 0)
    conn = np.where(rng.random(n) < 0.25, uni(500 * _US, 5 * _MS, n), 0)
    overhead = uni(20 * _US, 150 * _US, n)
    d = uni(200 * _US, 8 * _MS, n)
    t0 = uni(30 * _US, 300 * _US, n)
    has_tok = rng.random(n) < 0.95
    tok = np.where(has_tok, (uncached + cached) * uni(1 * _US, 3 * _US, n), 0)
    g1 = np.where(rng.random(n) < 0.25, uni(20 * _US, 500 * _US, n), 0)
    sent = c0 + conn + overhead
    s = sent + d
    q0 = s + t0 + tok + g1

    # Cohort iterations: admission, schedule, chunks with gaps, gpu work.
    q1 = np.maximum.reduceat(q0, starts[:-1]) + _US + rng.exponential(10 * _MS, m).astype(np.int64)
    sch = uni(50 * _US, 400 * _US, m)
    dur = (1.5 * _MS + 35 * _US * prefill_tokens + 2 * attention) * rng.uniform(0.9, 1.1, (m, 3))
    dur = np.where(live, dur.astype(np.int64), 0)
    gap = np.where(live[:, 1:], uni(3 * _MS, 30 * _MS, (m, 2)), 0)
    cs = np.empty((m, 3), np.int64)
    cs[:, 0] = q1 + sch
    cs[:, 1] = cs[:, 0] + dur[:, 0] + gap[:, 0]
    cs[:, 2] = cs[:, 1] + dur[:, 1] + gap[:, 1]
    ce = cs + dur
    last = np.arange(m), k - 1
    pe = ce[last]
    fs = cs + uni(100 * _US, 600 * _US, (m, 3))
    fe = fs + ((ce - fs) * rng.uniform(0.2, 0.6, (m, 3))).astype(np.int64)
    gs = fs + uni(20 * _US, 100 * _US, (m, 3))
    ge = ce - uni(50 * _US, 300 * _US, (m, 3))
    ov = uni(100 * _US, 1500 * _US, m)
    ge[last] = pe + ov
    gpu_in = np.where(live, np.minimum(ge, ce) - gs, 0).sum(axis=1)

    # First token: sample (outlasting the gpu tail), detokenize, stream, then the client.
    samp = ov[cohort] + uni(30 * _US, 400 * _US, n)
    se = pe[cohort] + samp
    det = uni(5 * _US, 60 * _US, n)
    strm = uni(20 * _US, 300 * _US, n)
    fb = se + det + strm
    ft = fb + d
    itl = uni(8 * _MS, 40 * _MS, n)[:, None] * rng.uniform(0.7, 1.3, (n, 3))
    token_ns = ft[:, None] + np.cumsum(itl.astype(np.int64), axis=1)
    tail = uni(50 * _US, 500 * _US, n)

    c = cohort
    parts = {
        "network": overhead + 2 * d, "connect": conn, "server": t0 + g1, "tokenize": tok,
        "queue": q1[c] - q0, "schedule": sch[c], "prefill": gap.sum(axis=1)[c],
        "prefill.chunk": (dur.sum(axis=1) - gpu_in)[c], "gpu_in": gpu_in[c], "ov": ov[c],
        "sample": samp, "detokenize": det, "stream": strm, "unattributed": np.where(has_tok, g1, 0),
    }
    return {
        "n": n, "m": m, "seed": seed, "starts": starts, "cohort": cohort, "k": k, "live": live,
        "step0": step0,
        "cached": cached, "prompt": uncached + cached, "tokens": tokens, "context": context,
        "prefill_tokens": prefill_tokens, "c0": c0, "wait": wait, "conn": conn, "sent": sent,
        "s": s, "t0": t0, "has_tok": has_tok, "tok": tok, "q0": q0, "q1": q1, "sch": sch,
        "cs": cs, "ce": ce, "fs": fs, "fe": fe, "gs": gs, "ge": ge, "gap": gap, "se": se,
        "det": det, "fb": fb, "ft": ft, "d": d, "token_ns": token_ns, "tail": tail,
        "parts": parts,
    }


def _block(lay: dict, c_lo: int, c_hi: int) -> pa.RecordBatch:
    """The rows of cohorts ``[c_lo, c_hi)``: their requests' traces and their engine traces."""
    starts = lay["starts"]
    r = np.arange(starts[c_lo], starts[c_hi])
    ids = request_ids(r)
    rows: list[tuple] = []

    def add(kind: str, ent: np.ndarray, slot, parent, start: np.ndarray, end: np.ndarray,
            rid: bool = True, attrs: pa.Array | None = None) -> None:
        size = len(ent)
        rows.append((np.full(size, _KIND[kind], np.int32), ent, np.broadcast_to(slot, size),
                     np.broadcast_to(parent, size), start, end,
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
    for name, at in (("scheduled", g["c0"] - g["wait"]), ("sent", g["sent"]),
                     ("headers", g["s"] + g["t0"] + g["d"]), ("first_chunk", g["ft"]),
                     (EV_FIRST_TOKEN, g["ft"])):
        add(name, r, _SLOT[name], cl, at, at, rid=False)
    for i in range(3):
        add(EV_TOKEN, r, _SLOT[EV_TOKEN] + i, cl, token_ns[:, i], token_ns[:, i], rid=False)

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
    add(EV_FIRST_SAMPLED, r, _SLOT[EV_FIRST_SAMPLED], _SLOT["sample"], g["se"], g["se"])
    add(EV_FIRST_BYTE, r, _SLOT[EV_FIRST_BYTE], _SLOT["stream"], g["fb"], g["fb"])

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
    ``split``) then engine traces (another contiguous range)."""
    kind, ent, slot, parent, start, end = (np.concatenate([row[j] for row in rows])
                                           for j in range(6))
    is_req = ent < entities[split]
    local = np.where(is_req, ent - entities[0], ent - entities[split] + split)
    ent = ent.astype(np.uint64)
    has_parent = parent >= 0
    arrays = [
        hex_strings(np.take(trace_hex(entities.astype(np.uint64), seed), local, axis=0)),
        hex_strings(span_hex(ent * _SLOTS + slot.astype(np.uint64), seed)),
        hex_strings(span_hex((ent * _SLOTS + parent.astype(np.uint64))[has_parent], seed),
                     has_parent),
        pa.concat_arrays([row[6] for row in rows]),
        _NAMES.take(pa.array(kind)),
        pa.DictionaryArray.from_arrays(pa.array(_STAGE_CODE[kind]), _STAGES),
        pa.array(start, pa.int64()),
        pa.array(end, pa.int64()),
        pa.DictionaryArray.from_arrays(pa.array(_CLOCK_CODE[kind]), _CLOCKS),
        pa.DictionaryArray.from_arrays(pa.array(_SERVICE_CODE[kind]), _SERVICES),
        pa.concat_arrays([row[7] for row in rows]),
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
