"""Chrome trace event JSON (chrome://tracing, Perfetto's JSON, PyTorch profiler's
``export_chrome_trace``), optionally gzip-compressed (up to `MAX_DECOMPRESSED_BYTES` decompressed).

How events become rows:

* ``X`` (``ts``, ``dur``) and ``B``/``E`` pairs (a stack per ``(pid, tid)``) are spans;
  async ``b``/``e`` (and legacy ``S``/``F``) pairs, matched per ``(pid, cat, id)``
  (``id2.global`` ignores the pid; ``S``/``F`` also match on the name), are spans whose
  parent is the enclosing async span of the same id;
* ``i``/``I`` (thread scope: parent is the innermost slice of the same ``(pid, tid)``
  containing it, ends included) and ``n`` (parent: the open async span of its id) are
  point events;
* ``M`` names processes and threads; flows (``s``/``t``/``f``) and counters (``C``) are
  counted, any other phase is counted as skipped; a ``B``/``E``/``b``/``e``/``S``/``F``
  without its partner is counted as ``unmatched`` (run metadata).

Slices of one ``(pid, tid)`` nest by time (sorted by start, longer first; a slice is
inside another when it starts in ``[start, end)`` and ends by ``end``). One trace per
``(file name, pid)``; ids are hashes of the file name and the pid or the event's index,
so re-importing yields the same rows.

GPU work (``cat`` ``kernel``/``gpu_memcpy``/``gpu_memset``, or ``device`` and ``stream``
args on a process labelled ``GPU``) has stage ``gpu`` and clock ``gpu:<args.device or
pid>``; its parent is the CPU ``cuda_runtime``/``cuda_driver`` launch with the same
``args.correlation`` (when present in the file), whose trace it joins. Other rows have
clock ``host:<process name or pid>``, service the process name (else the pid), and stage
from `ttft_fields` (``ttft.stage`` arg, else the name: a
``record_function("prefill.chunk")`` label is a ``prefill.chunk`` span).
``args`` become the attributes, with ``cat``, ``tid`` and ``thread_name`` added.

A file ``ttft export --perfetto`` wrote (``otherData.exporter`` ``"ttft"``) is read back as
the spans it shows: each event whose args hold ``trace_id``, ``span_id`` and ``stage`` (as
strings) takes its row's ids, request id, stage, service, clock, attributes (the exact text
in ``attributes_text`` where the exporter kept it) and times (``start_ns``/``end_ns``, exact;
a span that ends before its start is read as the point the export drew) from its args, and
its name from the event; other events follow the rules above.

Times: ``ts``/``dur`` are µs, parsed exactly and rounded once to ns. With PyTorch's
``baseTimeNanoseconds`` the result is epoch ns; without it ``ts`` keeps the file's own
zero and the metadata says ``"clock_epoch": false``.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from ttft.collectors.errors import TraceFileError
from ttft.collectors.importers._base import (
    decoded_head,
    fits_int64,
    load_json,
    read_bytes,
    rows_to_table,
)
from ttft.collectors.importers._chrome_convert import BadEvent, Converter, plain

_SKIP_PREFIX = b"\xef\xbb\xbf \t\r\n"


class ChromeTrace:
    name = "chrome"
    description = "Chrome trace event JSON (incl. PyTorch profiler export_chrome_trace)"

    def guess_can_open(self, path: Path) -> bool:
        data = decoded_head(path, 4096)[0].lstrip(_SKIP_PREFIX)
        if data[:1] == b"{":
            return b'"traceEvents"' in data
        return data[:1] == b"[" and b'"ph"' in data

    def read(self, path: Path) -> pa.Table:
        document = _load(path)
        if isinstance(document, dict):
            events = document.get("traceEvents")
            if not isinstance(events, list):
                raise TraceFileError(path, "field 'traceEvents': expected a list of events")
        elif isinstance(document, list):
            events, document = document, {}
        else:
            raise TraceFileError(path, "expected {\"traceEvents\": [...]} or a list of events")
        base_ns = document.get("baseTimeNanoseconds")
        if base_ns is not None and (isinstance(base_ns, bool) or not isinstance(base_ns, int)
                                    or not fits_int64(base_ns)):
            raise TraceFileError(
                path, f"field 'baseTimeNanoseconds': expected a 64-bit integer, got {base_ns!r}"
            )
        try:
            rows, counts = Converter(path.name, base_ns or 0,
                                     exported=_exported_by_ttft(document)).convert(events)
        except BadEvent as exc:
            raise TraceFileError(path, str(exc)) from None
        except RecursionError:
            raise TraceFileError(path, "an event's args are nested too deeply") from None
        metadata: dict[str, Any] = {"clock_epoch": base_ns is not None, **counts}
        if base_ns is not None:
            metadata["base_time_ns"] = base_ns
        for key, meta_key in (("deviceProperties", "device_properties"),
                              ("displayTimeUnit", "display_time_unit")):
            if key in document:
                metadata[meta_key] = plain(document[key])
        rest = {k: v for k, v in document.items() if k not in (
            "traceEvents", "baseTimeNanoseconds", "deviceProperties", "displayTimeUnit")}
        if rest:
            metadata["trace_metadata"] = plain(rest)
        return rows_to_table(rows, path, self.name, **metadata)


def _exported_by_ttft(document: dict[str, Any]) -> bool:
    other = document.get("otherData")
    return isinstance(other, dict) and other.get("exporter") == "ttft"


def _load(path: Path) -> Any:
    raw = read_bytes(path)
    try:
        return load_json(raw, path, parse_float=Decimal)
    except TraceFileError as exc:
        error = exc
    # The array form may omit its closing bracket (Trace Event Format); nothing else may.
    text = raw.decode("utf-8", "replace").strip().lstrip("\ufeff")
    if text.startswith("[") and not text.endswith("]"):
        try:
            return load_json(text.rstrip(",") + "]", path, parse_float=Decimal)
        except TraceFileError:
            pass
    raise error
