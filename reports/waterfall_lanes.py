"""The lanes of a request's waterfall: which worker drew each span, and on which lane.

A worker is a (service, clock) pair. In a trace whose server side has one service (one
engine, co-located) a worker is named by its clock alone (``host:a``, ``gpu:0``); when the
server side has several (disaggregated prefill and decode workers, a router in front of an
engine), each is named ``service @ clock``. The client is always ``client``. Each worker's
spans take lanes of their own, its engine steps another group (``<worker> steps``) and its
``kv_transfer`` spans another (``<worker> kv_transfer``), so a transfer is never drawn
over the prefill chunks it overlaps. Lane labels are ``<group> · <n>``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["clock_kind", "event_lanes", "lane_order", "lanes", "workers"]

_KIND_ORDER = {"client": 0, "host": 1, "gpu": 2}
_GROUP_ORDER = {"": 0, " kv_transfer": 1, " steps": 2}
_OWN_GROUP = {"step": " steps", "kv_transfer": " kv_transfer"}


def clock_kind(clock: str) -> str:
    """``client``, ``gpu`` (a ``gpu:`` clock) or ``host`` (any other server clock)."""
    if clock == "client":
        return "client"
    return "gpu" if clock.startswith("gpu:") else "host"


def workers(frame: pd.DataFrame) -> np.ndarray:
    """The worker label of each row of ``frame`` (``clock`` and ``service`` columns, a
    missing service as ``""``), as the module docstring names them (object array)."""
    clock = frame["clock"].astype(str).to_numpy(object)
    service = frame["service"].astype(str).to_numpy(object)
    server = clock != "client"
    if len({s for s in service[server] if s}) <= 1:
        return clock.copy()
    named = np.array([f"{s} @ {c}" if s else c for s, c in zip(service, clock, strict=True)],
                     dtype=object)
    return np.where(server, named, clock).astype(object)


def lanes(spans: pd.DataFrame, worker: np.ndarray) -> list[str]:
    """Greedy interval lanes per group (``worker`` of each span, `workers`; steps and
    transfers in groups of their own): in row order, a span goes on the first lane of its
    group whose last span ended at or before it starts, so no two bars of a lane overlap."""
    ends: dict[str, list[int]] = {}
    out = []
    rows = zip(worker, spans["stage"], spans["start_ns"], spans["end_ns"], strict=True)
    for name, stage, start, end in rows:
        group = name + _OWN_GROUP.get(stage, "")
        lane_ends = ends.setdefault(group, [])
        for i, lane_end in enumerate(lane_ends):
            if lane_end <= start:
                lane_ends[i] = end
                break
        else:
            lane_ends.append(end)
            i = len(lane_ends) - 1
        out.append(f"{group} · {i + 1}")
    return out


def _key(label: str) -> tuple[int, str, int, int]:
    group, _, n = label.rpartition(" · ")
    worker, suffix = group, ""
    for own in _OWN_GROUP.values():
        if group.endswith(own):
            worker, suffix = group[: -len(own)], own
    clock = worker.rpartition(" @ ")[2]
    return (_KIND_ORDER[clock_kind(clock)], worker, _GROUP_ORDER[suffix], int(n))


def lane_order(labels) -> list[str]:
    """Lane labels top to bottom: client lanes, then host, then gpu; within a kind by
    worker, each worker's own lanes, then its transfer lanes, then its steps, by number."""
    return sorted(set(labels), key=_key)


def event_lanes(worker: np.ndarray, labels: list[str]) -> list[str]:
    """The lane each point event is drawn on (``worker`` of each event): its worker's
    first own lane among ``labels`` (`lane_order`), else ``<worker> · 1``."""
    first: dict[str, str] = {}
    for label in lane_order(labels):
        first.setdefault(label.rpartition(" · ")[0], label)
    return [first.get(w, f"{w} · 1") for w in worker]
