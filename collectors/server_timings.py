"""Per-request timings a server reports in its own response, placed as spans on the client's
clock (docs/attribution.md, "Server-reported timings").

Many servers export no spans but say, in the response, how long a request queued and how
long its prompt took. Each source below is read from its documented shape; its durations
become a chain of spans laid back to back so that the last ends at the client's anchor
(the first token it saw, or the response's end), each earlier one ending where the next
begins. A duration whose later neighbours are unknown cannot be placed and is left out;
a span reaching before the client's send is clipped there. Every span is an
estimate (``tracer.schema.ATTR_ESTIMATED``, its text says which field and how it was
placed): the gap between the server's first token and the client's (the send, the network)
lands inside the last span. One source is used per request: the first of `SOURCES` whose
fields are present and place a span.

Sources (the fields read; durations in the unit each documents):

- Dynamo (ai-dynamo/dynamo, OpenAI frontend ``nvext``; a request asks with ``nvext:
  {"extra_fields": ["timing"]}``): ``nvext.timing`` with ``RequestTracker``'s fields
  (``lib/llm/src/protocols/common/timing.rs``): ``prefill_wait_time_ms`` (receipt to
  prefill start: ``queue``), ``prefill_time_ms`` (prefill start to first token: ``prefill``).
- vLLM per-request ``metrics`` in the response (``vllm serve
  --enable-per-request-metrics``; vLLM's ``docs/features/per_request_metrics.md``, ms):
  ``queue_time_ms`` (``queue``) and ``time_to_first_token_ms`` (``prefill``: vLLM counts its
  TTFT from the scheduling, so the queue comes before it, never inside);
  ``generation_time_ms``, ``mean_itl_ms``, ``tokens_per_second`` kept as attributes.
- SGLang ``meta_info`` (native ``/generate``; seconds): ``queue_time`` (``queue``),
  ``prefill_launch_delay`` (``batch_wait``), ``prefill_launch_latency`` (``prefill``).
- TensorRT-LLM (``trtllm-serve``): the ``Server-Timing`` header (W3C Server Timing,
  ``name;dur=<ms>``): ``server_queue`` (``queue``) and ``server_ttft`` minus it
  (``prefill``); ``server_e2e`` is kept as an attribute.
- TGI: headers ``x-queue-time`` (``queue``) and ``x-inference-time`` (ms; prefill and
  decode together, so a span named ``inference``, stage ``other``), ending at the
  response's end (TGI sends them with a whole, non-streamed answer).
- llama.cpp server (``tools/server/README.md``): ``timings`` in the final chunk or the
  response: ``prompt_ms`` (``prefill``); ``prompt_n``, ``cache_n``, ``predicted_n``,
  ``predicted_ms`` kept as attributes. ttft's reference server (``ttft serve
  --report-timings``) adds ``queue_ms`` (``queue``), which llama.cpp does not send.
- Ollama (its API reference, ``api.md`` in the ollama repository; the final object of
  ``/api/generate`` and ``/api/chat``; nanoseconds): ``load_duration`` (a span named
  ``load``, stage ``other``) and ``prompt_eval_duration`` (``prefill``); counts and
  ``eval_duration`` as attributes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ttft.tracer.schema import stage_of

__all__ = ["CAPTURED", "SOURCES", "ReportedSpan", "capture", "reported_spans",
           "server_timing_metrics"]

FIRST_TOKEN, END = "first token", "response end"
"""The client's moments a chain of reported durations ends at."""
_OLLAMA = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration",
           "prompt_eval_count", "eval_count")
CAPTURED = frozenset(("timings", "metrics", "meta_info", "nvext", *_OLLAMA))
"""Top-level response fields `capture` keeps (their last value)."""
_MS, _S = 1e6, 1e9


@dataclass(frozen=True)
class ReportedSpan:
    """One reported duration placed on the client's clock (epoch ns): ``name`` (its stage
    is ``stage_of(name)``), ``estimated`` (the ``ATTR_ESTIMATED`` text), ``attributes`` (the
    source and the figures it reported beside)."""

    name: str
    start_ns: int
    end_ns: int
    estimated: str
    attributes: Mapping[str, Any] = field(default_factory=dict)

    @property
    def stage(self) -> str:
        return stage_of(self.name)


@dataclass(frozen=True)
class _Report:
    """What one source said: ``parts`` in time order as ``(name, dur_ns or None, field)``,
    the last ending at ``anchor``."""

    source: str
    anchor: str
    parts: tuple[tuple[str, int | None, str], ...]
    attributes: dict[str, Any]


def capture(payload: Mapping[str, Any], into: dict[str, Any]) -> None:
    """Keep the `CAPTURED` fields of one response object (a stream chunk or a whole body)
    in ``into``, a later value replacing an earlier one. Called on every chunk: cheap."""
    for key in payload.keys() & CAPTURED:
        value = payload[key]
        if value is not None:
            into[key] = value


def _ns(value: Any, scale: float) -> int | None:
    """A non-negative finite number in a unit (``scale`` ns each) → ns; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0 or value * scale > 2**62:
        return None
    return round(value * scale)


def _scalars(obj: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The number, text and flag fields of ``obj``, keys prefixed (nested ones left out)."""
    return {f"{prefix}{k}": v for k, v in obj.items()
            if isinstance(v, (int, float, str, bool)) and isinstance(k, str)}


def _dynamo(headers: Mapping[str, str], fields: Mapping[str, Any]) -> _Report | None:
    nvext = fields.get("nvext")
    timing = nvext.get("timing") if isinstance(nvext, Mapping) else None
    if not isinstance(timing, Mapping):
        return None
    return _Report("dynamo nvext.timing", FIRST_TOKEN, (
        ("queue", _ns(timing.get("prefill_wait_time_ms"), _MS), "prefill_wait_time_ms"),
        ("prefill", _ns(timing.get("prefill_time_ms"), _MS), "prefill_time_ms"),
    ), _scalars(timing, "dynamo."))


def _vllm(headers: Mapping[str, str], fields: Mapping[str, Any]) -> _Report | None:
    m = fields.get("metrics")
    if not isinstance(m, Mapping) or "time_to_first_token_ms" not in m:
        return None
    # vLLM's time_to_first_token_ms counts from the scheduling: the queue comes before it
    return _Report("vllm metrics", FIRST_TOKEN, (
        ("queue", _ns(m.get("queue_time_ms"), _MS), "queue_time_ms"),
        ("prefill", _ns(m.get("time_to_first_token_ms"), _MS), "time_to_first_token_ms"),
    ), _scalars(m, "vllm."))


def _sglang(headers: Mapping[str, str], fields: Mapping[str, Any]) -> _Report | None:
    meta = fields.get("meta_info")
    if not isinstance(meta, Mapping):
        return None
    return _Report("sglang meta_info", FIRST_TOKEN, tuple(
        (name, _ns(meta.get(key), _S), key)
        for name, key in (("queue", "queue_time"), ("batch_wait", "prefill_launch_delay"),
                          ("prefill", "prefill_launch_latency"))
        if key in meta or name == "prefill"
    ), _scalars(meta, "sglang."))


_ITEM = re.compile(r'(?:[^,"]|"(?:\\.|[^"\\])*")+')
_PARAM = re.compile(r'(?:[^;"]|"(?:\\.|[^"\\])*")+')


def server_timing_metrics(header: str) -> dict[str, float]:
    """The ``dur`` (ms) of each metric of a W3C ``Server-Timing`` header (several headers
    joined by commas); a metric without a numeric ``dur`` is left out, and of a name given
    twice the first is kept."""
    out: dict[str, float] = {}
    for item in _ITEM.findall(header):
        name, *params = (p.strip() for p in _PARAM.findall(item))
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() != "dur" or name in out:
                continue
            try:
                dur = float(value.strip().strip('"'))
            except ValueError:
                continue
            if math.isfinite(dur) and name:
                out[name] = dur
    return out


def _trtllm(headers: Mapping[str, str], fields: Mapping[str, Any]) -> _Report | None:
    header = headers.get("server-timing")
    if not header:
        return None
    metrics = server_timing_metrics(header)
    queue, ttft = metrics.get("server_queue"), metrics.get("server_ttft")
    if queue is None or ttft is None or not 0 <= queue <= ttft:
        return None  # a queue longer than the TTFT it is part of (or negative): no split
    return _Report("trt-llm Server-Timing", FIRST_TOKEN, (
        ("queue", _ns(queue, _MS), "server_queue"),
        ("prefill", _ns(ttft - queue, _MS), "server_ttft - server_queue"),
    ), {f"server_timing.{k}": v for k, v in metrics.items()})


def _header_ms(headers: Mapping[str, str], name: str) -> int | None:
    try:
        return _ns(float(headers.get(name, "")), _MS)
    except ValueError:
        return None


def _tgi(headers: Mapping[str, str], fields: Mapping[str, Any]) -> _Report | None:
    if "x-inference-time" not in headers:
        return None
    names = ("x-queue-time", "x-inference-time", "x-validation-time", "x-total-time",
             "x-time-per-token")
    return _Report("tgi headers", END, (
        ("queue", _header_ms(headers, "x-queue-time"), "x-queue-time"),
        ("inference", _header_ms(headers, "x-inference-time"), "x-inference-time"),
    ), {f"tgi.{k}": headers[k] for k in names if k in headers})


def _llamacpp(headers: Mapping[str, str], fields: Mapping[str, Any]) -> _Report | None:
    t = fields.get("timings")
    if not isinstance(t, Mapping):
        return None
    parts = (("queue", _ns(t.get("queue_ms"), _MS), "queue_ms"),) if "queue_ms" in t else ()
    return _Report("llama.cpp timings", FIRST_TOKEN,
                   (*parts, ("prefill", _ns(t.get("prompt_ms"), _MS), "prompt_ms")),
                   _scalars(t, "llama.cpp."))


def _ollama(headers: Mapping[str, str], fields: Mapping[str, Any]) -> _Report | None:
    if "prompt_eval_duration" not in fields:
        return None
    parts = ((("load", _ns(fields.get("load_duration"), 1), "load_duration"),)
             if "load_duration" in fields else ())
    return _Report("ollama", FIRST_TOKEN,
                   (*parts, ("prefill", _ns(fields.get("prompt_eval_duration"), 1),
                             "prompt_eval_duration")),
                   {f"ollama.{k}": fields[k] for k in _OLLAMA if k in fields})


SOURCES: tuple[tuple[str, Callable[[Mapping[str, str], Mapping[str, Any]], _Report | None]],
               ...] = (
    ("dynamo", _dynamo), ("vllm", _vllm), ("sglang", _sglang), ("trtllm", _trtllm),
    ("tgi", _tgi), ("llama.cpp", _llamacpp), ("ollama", _ollama),
)
"""The sources, in the order one is chosen per request."""


def _placed(report: _Report, anchor_ns: int, start_ns: int) -> list[ReportedSpan]:
    """The report's parts laid back to back, the last ending at ``anchor_ns``, none
    reaching before ``start_ns``; from the first unknown duration backwards, nothing."""
    out: list[ReportedSpan] = []
    cursor, after = anchor_ns, f"the client's {report.anchor}"
    for name, dur_ns, source_field in reversed(report.parts):
        if dur_ns is None or cursor <= start_ns:
            break
        begin = cursor - dur_ns
        if dur_ns > 0:
            clipped = (" (clipped at the client's send: the reported durations exceed the "
                       "time the client measured from it)" if begin < start_ns else "")
            text = (f"{report.source} {source_field} ({dur_ns / _MS:g} ms), placed to end at "
                    f"{after}{clipped}")
            out.append(ReportedSpan(name, max(begin, start_ns), cursor, text,
                                    {"source": report.source, **report.attributes}))
        cursor, after = begin, f"the start of the reported {name}"
    return out[::-1]


def reported_spans(headers: Mapping[str, str], fields: Mapping[str, Any], *, start_ns: int,
                   first_token_ns: int | None, end_ns: int) -> list[ReportedSpan]:
    """The spans of the first source in `SOURCES` that places any (module docstring).

    Args:
        headers: the response headers, names in lowercase.
        fields: what `capture` kept of the response's objects.
        start_ns, end_ns: the client span's start and end.
        first_token_ns: the client's ``first_token`` event; None without one (then only
            sources anchored at the response's end place anything).

    Returns:
        The spans in time order; empty when no source placed one.
    """
    for _, parse in SOURCES:
        report = parse(headers, fields)
        if report is None:
            continue
        anchor = first_token_ns if report.anchor == FIRST_TOKEN else end_ns
        if anchor is None:
            continue
        spans = _placed(report, min(anchor, end_ns), start_ns)
        if spans:
            return spans
    return []
