"""Checks a Chrome trace-event list the way a viewer would read it: `validate_events`."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

_META = frozenset(("process_name", "thread_name", "process_sort_index", "thread_sort_index"))


def validate_events(events: list[dict]) -> list[str]:
    """Problems that would make a viewer drop or misplace events; ``[]`` when none.

    Checks the fields each phase needs, that ``b``/``e`` pairs match as a stack per
    (pid, cat, id), that ``X`` slices on one thread nest, that each flow has one ``s`` and
    one ``f`` (``bp: "e"``) inside an ``X`` slice of their thread, that every pid and tid
    is named by an ``M`` event, and that the list is valid JSON (no NaN).
    """
    problems: list[str] = []
    need = {"X": ("name", "ts", "dur", "tid"), "b": ("name", "cat", "ts"), "e": ("cat", "ts"),
            "n": ("name", "cat", "ts"), "i": ("name", "ts", "s"), "I": ("name", "ts", "s"),
            "s": ("id", "ts", "cat", "tid"), "f": ("id", "ts", "cat", "tid", "bp"),
            "M": ("name", "args")}  # fmt: skip
    good: list[tuple[int, dict]] = []
    for at, ev in enumerate(events):
        where = f"event {at} ({ev.get('ph')!r} {ev.get('name')!r})"
        missing = [f for f in ("ph", "pid", *need.get(ev.get("ph"), ())) if f not in ev]
        if ev.get("ph") not in need:
            problems.append(f"{where}: unknown phase")
        elif missing:
            problems.append(f"{where}: missing {', '.join(missing)}")
        elif not all(_number(ev[f]) for f in ("ts", "dur") if f in ev):
            problems.append(f"{where}: ts/dur not a finite number")
        elif ev.get("dur", 0) < 0:
            problems.append(f"{where}: negative dur")
        elif ev["ph"] in "ben" and _async_id(ev) is None:
            problems.append(f"{where}: no id or id2")
        elif ev["ph"] in "iI" and ev["s"] not in ("g", "p", "t"):
            problems.append(f"{where}: scope {ev['s']!r} not g, p or t")
        elif ev["ph"] == "f" and ev["bp"] != "e":
            problems.append(f"{where}: flow end without bp 'e'")
        elif ev["ph"] == "M" and not _meta_ok(ev):
            problems.append(f"{where}: bad metadata event")
        else:
            good.append((at, ev))
    try:
        json.dumps(events, allow_nan=False)
    except (TypeError, ValueError) as exc:
        problems.append(f"not valid JSON: {exc}")
    return problems + _check_async(good) + _check_slices(good) + _check_names(good)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _ns(us: float) -> int:
    return round(us * 1000)


def _async_id(ev: dict) -> tuple[str, str] | None:
    if "id" in ev:
        return ("id", str(ev["id"]))
    id2 = ev.get("id2")
    if isinstance(id2, dict) and ("local" in id2 or "global" in id2):
        scope = "local" if "local" in id2 else "global"
        return (scope, str(id2[scope]))
    return None


def _meta_ok(ev: dict) -> bool:
    args = ev["args"]
    if ev["name"] not in _META or not isinstance(args, dict):
        return False
    field = "name" if ev["name"].endswith("_name") else "sort_index"
    return field in args and (ev["name"].startswith("process") or "tid" in ev)


def _check_async(good: list[tuple[int, dict]]) -> list[str]:
    problems: list[str] = []
    stacks: dict[tuple, list[tuple[int, dict]]] = defaultdict(list)
    timed = sorted((item for item in good if item[1]["ph"] in "be"), key=lambda a: a[1]["ts"])
    for at, ev in timed:
        stack = stacks[(ev["pid"], ev["cat"], _async_id(ev))]
        if ev["ph"] == "b":
            stack.append((at, ev))
        elif not stack:
            problems.append(f"event {at}: 'e' {ev.get('name')!r} without a matching 'b'")
        elif ev.get("name", stack[-1][1]["name"]) != stack[-1][1]["name"]:
            problems.append(
                f"event {at}: 'e' {ev['name']!r} closes 'b' {stack[-1][1]['name']!r} "
                f"(event {stack[-1][0]}) of {_async_id(ev)}"
            )
            stack.pop()
        else:
            stack.pop()
    for key, stack in stacks.items():
        problems += [f"event {at}: 'b' {ev['name']!r} of {key} never ends" for at, ev in stack]
    return problems


def _check_slices(good: list[tuple[int, dict]]) -> list[str]:
    problems: list[str] = []
    slices: dict[tuple, list[tuple[int, int, int]]] = defaultdict(list)
    for at, ev in good:
        if ev["ph"] == "X":
            start = _ns(ev["ts"])
            slices[(ev["pid"], ev["tid"])].append((start, start + _ns(ev["dur"]), at))
    for thread, spans in slices.items():
        spans.sort(key=lambda s: (s[0], -s[1], s[2]))
        stack: list[tuple[int, int, int]] = []
        for start, end, at in spans:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                problems.append(
                    f"event {at}: X slice partially overlaps event {stack[-1][2]} on "
                    f"pid/tid {thread}"
                )
                continue
            stack.append((start, end, at))
    ends: dict[tuple, dict[str, list[int]]] = defaultdict(lambda: {"s": [], "f": []})
    for at, ev in good:
        if ev["ph"] in "sf":
            ends[(ev["cat"], str(ev["id"]))][ev["ph"]].append(at)
            t_ns, spans = _ns(ev["ts"]), slices.get((ev["pid"], ev["tid"]), [])
            if not any(s <= t_ns < e for s, e, _ in spans):
                problems.append(f"event {at}: flow '{ev['ph']}' outside every X slice of its tid")
    for key, found in ends.items():
        if len(found["s"]) != 1 or len(found["f"]) != 1:
            problems.append(f"flow {key}: {len(found['s'])} 's' and {len(found['f'])} 'f' events")
    return problems


def _check_names(good: list[tuple[int, dict]]) -> list[str]:
    named_pids = {ev["pid"] for _, ev in good if ev["ph"] == "M" and ev["name"] == "process_name"}
    named_tids = {
        (ev["pid"], ev["tid"]) for _, ev in good if ev["ph"] == "M" and ev["name"] == "thread_name"
    }
    problems: list[str] = []
    for pid in sorted({ev["pid"] for _, ev in good} - named_pids, key=str):
        problems.append(f"pid {pid} has no process_name")
    used = {(ev["pid"], ev["tid"]) for _, ev in good if "tid" in ev and ev["ph"] != "M"}
    for pid, tid in sorted(used - named_tids, key=str):
        problems.append(f"pid {pid} tid {tid} has no thread_name")
    return problems
