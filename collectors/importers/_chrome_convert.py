"""Chrome trace events → span rows (the conversion behind
`ttft.collectors.importers.chrome.ChromeTrace`; the rules are in that module's docstring)."""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

from ttft.collectors._spans import ttft_fields
from ttft.collectors.importers._base import fits_int64

_GPU_CATS = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))
_LAUNCH_CATS = frozenset(("cuda_runtime", "cuda_driver"))
_GPU_LABEL = re.compile(r"\s*GPU\b", re.IGNORECASE)


class BadEvent(Exception):
    """A malformed event; the message names it (``traceEvents[12].ts``)."""


@dataclass
class _Item:
    """A span or point event under construction."""

    index: int  # of the (first) event in traceEvents: the span id's seed
    ph: str
    name: str
    pid: Any
    tid: Any
    cat: Any
    start_ns: int
    end_ns: int
    args: dict[str, Any]
    parent: int | None = None  # index of the parent item
    extra: dict[str, Any] = field(default_factory=dict)


def plain(value: Any) -> Any:
    """JSON-able copy (exactly parsed decimals → float)."""
    return json.loads(json.dumps(value, default=float))


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=float)


def _hash(*parts: Any, size: int) -> str:
    text = "\0".join(json.dumps(p, default=str) for p in parts)
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


class Converter:
    def __init__(self, file_name: str, base_ns: int, *, exported: bool = False) -> None:
        self.file_name = file_name
        self.base_ns = base_ns
        self.exported = exported  # ttft's own export: span fields are read back from args
        self.items: list[_Item] = []
        self.process_name: dict[Any, str] = {}
        self.process_labels: dict[Any, str] = {}
        self.thread_name: dict[tuple[Any, Any], str] = {}
        self.unmatched = 0
        self.flows = 0
        self.counters = 0
        self.skipped: dict[str, int] = defaultdict(int)

    # -- pass 1: events → items ---------------------------------------------------------

    def convert(self, events: list[Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        slices: dict[tuple[Any, Any], list[tuple[int, dict, int]]] = defaultdict(list)
        asyncs: dict[tuple, list[_Item]] = defaultdict(list)
        for index, event in enumerate(events):
            at = f"traceEvents[{index}]"
            if not isinstance(event, dict):
                raise BadEvent(f"{at}: expected an event object, got {event!r}")
            ph = event.get("ph")
            if not isinstance(ph, str):
                raise BadEvent(f"{at}.ph: expected a phase string, got {ph!r}")
            if ph == "M":
                self._metadata(event)
            elif ph == "X":
                start_ns = self._ns(event.get("ts"), f"{at}.ts")
                dur = event.get("dur", 0)
                end_ns = self._ns(_add(event.get("ts"), dur, f"{at}.dur"), f"{at}.dur")
                if end_ns < start_ns:
                    raise BadEvent(f"{at}.dur: negative duration {dur}")
                self.items.append(self._item(index, event, start_ns, end_ns, at))
            elif ph == "B":
                key = (event.get("pid"), event.get("tid"))
                slices[key].append((index, event, self._ns(event.get("ts"), f"{at}.ts")))
            elif ph == "E":
                stack = slices[(event.get("pid"), event.get("tid"))]
                end_ns = self._ns(event.get("ts"), f"{at}.ts")
                if not stack:
                    self.unmatched += 1
                    continue
                begin_index, begin, start_ns = stack.pop()
                if end_ns < start_ns:
                    raise BadEvent(f"{at}.ts: ends before its B (traceEvents[{begin_index}])")
                merged = {**begin, "args": {**_args(begin, at), **_args(event, at)}}
                self.items.append(self._item(begin_index, merged, start_ns, end_ns, at))
            elif ph in ("b", "S", "e", "F", "n"):
                self._async(index, event, ph, asyncs, at)
            elif ph in ("i", "I"):
                ns = self._ns(event.get("ts"), f"{at}.ts")
                item = self._item(index, event, ns, ns, at)
                item.extra["scope"] = event.get("s", "t")
                self.items.append(item)
            elif ph in ("s", "t", "f"):
                self.flows += 1
            elif ph == "C":
                self.counters += 1
            else:
                self.skipped[ph] += 1
        self.unmatched += sum(map(len, slices.values())) + sum(map(len, asyncs.values()))
        self.items.sort(key=lambda item: item.index)
        self._nest()
        counts = {"unmatched": self.unmatched, "flow_events": self.flows,
                  "counter_events": self.counters, "skipped_events": dict(self.skipped)}
        return self._rows(), counts

    def _metadata(self, event: dict[str, Any]) -> None:
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        pid, kind = event.get("pid"), event.get("name")
        if kind == "process_name" and args.get("name") is not None:
            self.process_name[pid] = str(args["name"])
        elif kind == "process_labels" and args.get("labels") is not None:
            self.process_labels[pid] = str(args["labels"])
        elif kind == "thread_name" and args.get("name") is not None:
            self.thread_name[(pid, event.get("tid"))] = str(args["name"])

    def _async(self, index: int, event: dict, ph: str, asyncs: dict, at: str) -> None:
        id2 = event.get("id2") if isinstance(event.get("id2"), dict) else {}
        if "global" in id2:
            key: tuple = ("global", event.get("cat"), id2["global"])
        else:
            key = (event.get("pid"), event.get("cat"), id2.get("local", event.get("id")))
        if ph in ("S", "F"):
            key = (*key, "legacy", event.get("name"))
        stack = asyncs[key]
        ns = self._ns(event.get("ts"), f"{at}.ts")
        if ph in ("b", "S"):
            item = self._item(index, event, ns, ns, at)
            item.extra["id"] = key[2]
            item.parent = stack[-1].index if stack else None
            stack.append(item)
            return
        if ph == "n":
            item = self._item(index, event, ns, ns, at)
            item.extra["id"] = key[2]
            item.parent = stack[-1].index if stack else None
            self.items.append(item)
            return
        name = event.get("name")
        match = next((i for i in range(len(stack) - 1, -1, -1)
                      if name is None or stack[i].name == name), None)
        if match is None:
            self.unmatched += 1
            return
        item = stack.pop(match)
        if ns < item.start_ns:
            raise BadEvent(f"{at}.ts: ends before its begin (traceEvents[{item.index}])")
        item.end_ns = ns
        item.args.update(_args(event, at))
        self.items.append(item)

    def _item(self, index: int, event: dict, start_ns: int, end_ns: int, at: str) -> _Item:
        name = event.get("name", "")
        if not isinstance(name, str):
            raise BadEvent(f"{at}.name: expected a string, got {name!r}")
        return _Item(index, event["ph"], name, event.get("pid"), event.get("tid"),
                     event.get("cat"), start_ns, end_ns, dict(_args(event, at)))

    def _ns(self, value_us: Any, at: str) -> int:
        if isinstance(value_us, bool) or not isinstance(value_us, (int, Decimal)):
            raise BadEvent(f"{at}: expected microseconds as a number, got {value_us!r}")
        if isinstance(value_us, int):
            value_ns = self.base_ns + value_us * 1000
        else:
            try:
                value_ns = self.base_ns + int((value_us * 1000).to_integral_value(ROUND_HALF_EVEN))
            except (InvalidOperation, OverflowError, ValueError):
                raise BadEvent(f"{at}: expected a finite number, got {value_us}") from None
        if not fits_int64(value_ns):
            raise BadEvent(f"{at}: {value_us} µs is beyond the int64 ns range")
        return value_ns

    # -- pass 2: parents ----------------------------------------------------------------

    def _nest(self) -> None:
        """Parents from time nesting per (pid, tid), then GPU work → its launch."""
        by_thread: dict[tuple[Any, Any], list[_Item]] = defaultdict(list)
        for item in self.items:
            if item.ph in ("X", "B") or (item.ph in ("i", "I") and item.extra["scope"] == "t"):
                by_thread[(item.pid, item.tid)].append(item)
        for items in by_thread.values():
            items.sort(key=lambda i: (i.start_ns, i.ph in ("i", "I"), -i.end_ns, i.index))
            stack: list[_Item] = []
            for item in items:
                instant = item.ph in ("i", "I")
                while stack and not _inside(item, stack[-1], instant):
                    stack.pop()
                item.parent = stack[-1].index if stack else None
                if not instant and item.end_ns > item.start_ns:
                    stack.append(item)
        launches: dict[Any, _Item] = {}
        for item in self.items:
            if item.cat in _LAUNCH_CATS and "correlation" in item.args:
                launches.setdefault(_hashable(item.args["correlation"]), item)
        for item in self.items:
            if item.ph not in ("X", "B") or not self._is_gpu(item):
                continue
            item.extra["gpu"] = True
            correlation = item.args.get("correlation")
            launch = None if correlation is None else launches.get(_hashable(correlation))
            if launch is not None:
                item.parent = launch.index
                item.extra["trace_pid"] = launch.pid

    def _is_gpu(self, item: _Item) -> bool:
        if item.cat in _GPU_CATS:
            return True
        label = self.process_labels.get(item.pid) or self.process_name.get(item.pid) or ""
        return "device" in item.args and "stream" in item.args and bool(_GPU_LABEL.match(label))

    # -- pass 3: rows -------------------------------------------------------------------

    def _rows(self) -> list[dict[str, Any]]:
        rows = []
        for item in self.items:
            if self.exported and (row := _exported_row(item)) is not None:
                rows.append(row)
                continue
            process = self.process_name.get(item.pid) or _pid_text(item.pid)
            attributes = {**item.args}
            for key, value in (("cat", item.cat), ("tid", item.tid),
                               ("thread_name", self.thread_name.get((item.pid, item.tid))),
                               *item.extra.items()):
                if value is not None and key not in ("gpu", "trace_pid"):
                    attributes[key] = value
            stage, request_id, clock, _ = ttft_fields(
                item.name, attributes, item.start_ns, item.end_ns
            )
            if item.ph in ("i", "I", "n"):
                stage = "event"
            if item.extra.get("gpu"):
                stage = "gpu"
                device = item.args.get("device")
                default_clock = f"gpu:{_pid_text(item.pid) if device is None else device}"
            else:
                default_clock = f"host:{process}"
            rows.append({
                "trace_id": _hash(self.file_name, item.extra.get("trace_pid", item.pid), size=16),
                "span_id": self._span_id(item.index),
                "parent_id": None if item.parent is None else self._span_id(item.parent),
                "request_id": None if request_id is None else str(request_id),
                "name": item.name,
                "stage": stage,
                "start_ns": item.start_ns,
                "end_ns": item.end_ns,
                "clock": default_clock if clock is None else str(clock),
                "service": process,
                "attributes": _json(attributes),
            })
        return rows

    def _span_id(self, index: int) -> str:
        return _hash(self.file_name, index, size=8)


_EXPORTED_IDS = ("trace_id", "span_id", "stage")
_EXPORTED_OPTIONAL = ("parent_id", "request_id", "clock", "service", "attributes_text")


def _exported_row(item: _Item) -> dict[str, Any] | None:
    """The span ``ttft export --perfetto`` wrote as ``item``, its fields from the args (None
    for an event without them, such as one added to the file afterwards)."""
    args = item.args
    if not all(isinstance(args.get(key), str) for key in _EXPORTED_IDS):
        return None
    optional = {key: args.get(key) for key in _EXPORTED_OPTIONAL}
    if not all(value is None or isinstance(value, str) for value in optional.values()):
        return None
    attributes = args.get("attributes")
    text = optional["attributes_text"]  # the exact text, where the object could not say it
    if text is None:
        text = _json(attributes) if isinstance(attributes, dict) and attributes else None
    times = [args.get("start_ns"), args.get("end_ns")]
    if (all(isinstance(t, int) and not isinstance(t, bool) and fits_int64(t) for t in times)
            and times[0] <= times[1]):
        start_ns, end_ns = times  # exact (an end before its start stays the point drawn)
    else:
        start_ns, end_ns = item.start_ns, item.end_ns
    return {
        "trace_id": args["trace_id"],
        "span_id": args["span_id"],
        "parent_id": optional["parent_id"],
        "request_id": optional["request_id"],
        "name": item.name,
        "stage": args["stage"],
        "start_ns": start_ns,
        "end_ns": end_ns,
        "clock": optional["clock"],
        "service": optional["service"],
        "attributes": text,
    }


def _inside(item: _Item, outer: _Item, instant: bool) -> bool:
    if instant:
        return outer.start_ns <= item.start_ns <= outer.end_ns
    return outer.start_ns <= item.start_ns < outer.end_ns and item.end_ns <= outer.end_ns


def _args(event: dict[str, Any], at: str) -> dict[str, Any]:
    args = event.get("args", {})
    if not isinstance(args, dict):
        raise BadEvent(f"{at}.args: expected an object, got {args!r}")
    return args


def _add(ts: Any, dur: Any, at: str) -> Any:
    if isinstance(dur, bool) or not isinstance(dur, (int, Decimal)):
        raise BadEvent(f"{at}: expected microseconds as a number, got {dur!r}")
    if isinstance(ts, bool) or not isinstance(ts, (int, Decimal)):
        return ts  # reported by the ts check
    return ts + dur


def _hashable(value: Any) -> Any:
    return json.dumps(value, default=str)


def _pid_text(pid: Any) -> str:
    return "unknown" if pid is None or pid == "" else str(pid)
