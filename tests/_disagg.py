"""Disaggregated traces for tests: a hand-built request on two workers with two clocks,
and a synthetic trace moved onto a prefill worker with a K/V transfer per request."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from _build import event, row

from ttft.tracer.schema import ATTR_KV_BLOCKS, ATTR_KV_BYTES, ATTR_KV_FIRST_TOKEN

PREFILL_SERVICE, PREFILL_CLOCK = "ttft-prefill", "host:a/prefill"
DECODE_SERVICE, DECODE_CLOCK = "ttft-server", "host:a"
PREFILL = {"service": PREFILL_SERVICE, "clock": PREFILL_CLOCK}
DECODE = {"service": DECODE_SERVICE, "clock": DECODE_CLOCK}
BLOCK_BYTES = 65536
PREFILL_STAGES = ("queue", "schedule", "prefill", "prefill.chunk")
ENGINE_STAGES = ("step", "forward", "gpu")
METADATA_COLOCATED = {"schema_version": 1, "engine": {"device": "cpu"}}
METADATA_DISAGG = {"schema_version": 1, "engine": {
    "device": "cpu", "disaggregated": {"first_token": "decode", "channel": "tcp 127.0.0.1"}}}


def two_workers(trace: int = 1, t0: int = 0, blocks: int = 4) -> list[dict]:
    """One request: the client, the decode worker's server span and tokenize, the prefill
    worker's queue and two chunks (its own clock and service), the transfer on the decode
    worker from inside the first chunk to 15 ns after the last, the decode worker's queue,
    sample and send. Times in ns from ``t0``."""
    kv = {ATTR_KV_BLOCKS: blocks, ATTR_KV_BYTES: blocks * BLOCK_BYTES}
    base = trace * 100
    return [
        row(trace, base + 1, "client", t0, t0 + 110, clock="client", service="loadgen"),
        event(trace, base + 13, "sent", t0 + 1, parent=base + 1, clock="client",
              service="loadgen"),
        row(trace, base + 2, "server", t0 + 2, t0 + 100, parent=base + 1, request_id=f"r{trace}",
            cached_tokens=0, **DECODE),
        row(trace, base + 3, "tokenize", t0 + 4, t0 + 10, parent=base + 2, **DECODE),
        row(trace, base + 4, "queue", t0 + 10, t0 + 20, parent=base + 2, **PREFILL),
        row(trace, base + 5, "prefill", t0 + 20, t0 + 60, parent=base + 2, **PREFILL),
        row(trace, base + 6, "prefill.chunk", t0 + 20, t0 + 35, parent=base + 5, step_id=1,
            chunk_tokens=16, **PREFILL),
        row(trace, base + 7, "prefill.chunk", t0 + 45, t0 + 60, parent=base + 5, step_id=2,
            chunk_tokens=16, **PREFILL),
        row(trace, base + 8, "kv_transfer", t0 + 30, t0 + 75, parent=base + 2, **DECODE, **kv),
        row(trace, base + 9, "queue", t0 + 75, t0 + 80, parent=base + 2, **DECODE),
        row(trace, base + 10, "sample", t0 + 80, t0 + 85, parent=base + 2, **DECODE),
        event(trace, base + 11, "first_sampled", t0 + 85, parent=base + 2, **DECODE),
        row(trace, base + 12, "stream", t0 + 88, t0 + 92, parent=base + 2, **DECODE),
        event(trace, base + 14, "first_byte", t0 + 92, parent=base + 2, **DECODE),
        event(trace, base + 15, "first_token", t0 + 95, parent=base + 1, clock="client",
              service="loadgen"),
    ]


def disaggregate(table: pa.Table, first_token: str | None = "decode") -> pa.Table:
    """A synthetic trace (``collectors.synthetic``) served disaggregated on one host: each
    request's queue, schedule and prefill spans and every engine step (with its forward and
    gpu spans) move to the prefill worker (service ``ttft-prefill``, host clock
    ``host:synth/prefill``, same epoch); each request with chunks gains a ``kv_transfer``
    under its server span on the decode worker, from the middle of its first chunk to half
    way through its ``sample``, carrying ``ceil(prompt_tokens / 16)`` blocks of
    `BLOCK_BYTES` and, as ttft's engine writes it, ``first_token`` (None: not named)."""
    side = {} if first_token is None else {ATTR_KV_FIRST_TOKEN: first_token}
    frame = table.to_pandas()
    for name in ("stage", "clock", "service"):
        frame[name] = frame[name].astype(object)
    moved = frame["stage"].isin(PREFILL_STAGES + ENGINE_STAGES).to_numpy()
    frame.loc[moved, "service"] = PREFILL_SERVICE
    host = moved & (frame["clock"] == "host:synth").to_numpy()
    frame.loc[host, "clock"] = "host:synth/prefill"
    chunks = frame[frame["stage"] == "prefill.chunk"].groupby("trace_id").agg(
        first_start=("start_ns", "min"), first_end=("end_ns", "min"), last_end=("end_ns", "max"))
    servers = frame[frame["stage"] == "server"].drop_duplicates("trace_id").set_index("trace_id")
    samples = frame[frame["stage"] == "sample"].drop_duplicates("trace_id").set_index("trace_id")
    added = []
    for i, (trace_id, c) in enumerate(sorted(chunks.iterrows())):
        server = servers.loc[trace_id]
        tokens = json.loads(server["attributes"]).get("prompt_tokens", 16)
        blocks = int(np.ceil(tokens / 16))
        end = int(c["last_end"]) + (int(samples.loc[trace_id, "end_ns"]) - int(c["last_end"])) // 2
        added.append({
            "trace_id": trace_id, "span_id": f"ffff{i:012x}", "parent_id": server["span_id"],
            "request_id": server["request_id"], "name": "kv_transfer", "stage": "kv_transfer",
            "start_ns": (int(c["first_start"]) + int(c["first_end"])) // 2, "end_ns": end,
            "clock": "host:synth", "service": "engine",
            "attributes": json.dumps({ATTR_KV_BLOCKS: blocks,
                                      ATTR_KV_BYTES: blocks * BLOCK_BYTES, **side},
                                     separators=(",", ":")),
        })
    out = pa.Table.from_pandas(frame, schema=table.schema, preserve_index=False)
    extra = pa.Table.from_pylist(added, schema=table.schema)
    return pa.concat_tables([out, extra]).replace_schema_metadata(table.schema.metadata)


def transfer_rows_of(table: pa.Table) -> pa.Table:
    """The ``kv_transfer`` rows of ``table``."""
    return table.filter(pc.equal(table.column("stage"), "kv_transfer"))
