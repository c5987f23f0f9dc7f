"""The sink of a traced run's OTLP receivers, in its recorder process
(``_trace_process``): rows go to the run's trace, and the traces they belong to are
remembered (which requests joined, which were served from a prefix cache)."""

from __future__ import annotations

import json
import threading

import pyarrow as pa
import pyarrow.compute as pc

from ttft.collectors.writer import TraceWriter
from ttft.tracer.schema import ATTR_CACHED_TOKENS


class SeenSink:
    """Forwards the receiver's rows to the writer and remembers the traces they joined
    (``trace_ids``) and those with a ``cached_tokens`` attribute above 0 (``cached_ids``).

    The receivers bind before the trace file exists (a busy port leaves no file behind), so
    rows that arrive before :meth:`attach` wait for it; after ``attach(None)`` (the trace
    could not be opened) they are refused, which the receiver answers as an error."""

    def __init__(self) -> None:
        self.writer: TraceWriter | None = None
        self.rows = 0
        self.trace_ids: set[str] = set()
        self.cached_ids: set[str] = set()
        self.lock = threading.Lock()
        self._attached = threading.Event()

    def attach(self, writer: TraceWriter | None) -> None:
        """Start forwarding to ``writer`` (None: refuse every row)."""
        self.writer = writer
        self._attached.set()

    def __call__(self, table: pa.Table) -> None:
        self._attached.wait()
        if self.writer is None:
            raise RuntimeError("the trace could not be opened")
        self.writer.append(table, durable=True)  # acknowledged only once on disk
        ids = pc.unique(table.column("trace_id")).to_pylist()
        cached = _cached_trace_ids(table)
        with self.lock:
            self.rows += table.num_rows
            self.trace_ids.update(ids)
            self.cached_ids.update(cached)


def _cached_trace_ids(table: pa.Table) -> set[str]:
    """The traces of the rows whose ``cached_tokens`` attribute is above 0."""
    marked = table.filter(pc.match_substring(table.column("attributes"),
                                             f'"{ATTR_CACHED_TOKENS}"'))
    out: set[str] = set()
    for trace_id, attrs in zip(marked.column("trace_id").to_pylist(),
                               marked.column("attributes").to_pylist(), strict=True):
        value = json.loads(attrs).get(ATTR_CACHED_TOKENS)
        if isinstance(value, int) and value > 0:
            out.add(trace_id)
    return out
