"""A trace's run metadata as the reports show it: every key as a dotted ``(key, value)``
row (`metadata_rows`), and the one line that says what the run was (`metadata_summary`:
model, device, workload, how many keys more), which the HTML report shows with the rows
folded away under it.

The summary reads the keys each of ttft's writers uses (``ttft trace`` and ``ttft sweep``:
``server.model``, ``server.models.data.<i>.ttft.device``, ``arguments.*``; the engine's own
metadata: ``engine.*``; ``ttft profile-prefill``: ``model``, ``device.*``; the synthetic
generator: ``generator``, ``requests``, ``rate_per_s``; ``ttft validate``: ``workload.*``)
and leaves out what a trace does not have.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["metadata_rows", "metadata_summary"]

_MODEL = ("server.model", "model", "arguments.model", "workload.model")
_DEVICE_NAME = re.compile(r"^(?:server\.models\.data\.\d+\.ttft\.)?device\.name$")
_DEVICE_TYPE = re.compile(r"^(?:server\.models\.data\.\d+\.ttft\.)?device\.type$")
_COMMAND = ("command", "tool", "generator", "workload.command")
_REQUESTS = ("arguments.requests", "requests", "workload.requests")
_RATE = ("arguments.rate", "rate_per_s")
_CONCURRENCY = ("arguments.concurrency", "workload.concurrency")
_PROMPT = ("arguments.prompt_tokens", "workload.prompt_tokens")
_OUTPUT = ("arguments.output_tokens", "workload.max_tokens")


def metadata_rows(metadata: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Run metadata as ``(key, value)`` text rows, sorted by key.

    Nested mappings are flattened into dotted keys (``model_config.hidden_size``), as are
    lists of mappings (``inputs.0.path``); strings stay as they are, other lists are joined
    with ``, `` and every other value (an empty mapping too) is its JSON text.
    """
    rows: list[tuple[str, str]] = []
    for key in sorted(metadata, key=str):
        value, name = metadata[key], f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            rows.extend(metadata_rows(value, f"{name}."))
        elif (
            isinstance(value, list | tuple) and value and all(isinstance(v, Mapping) for v in value)
        ):
            for i, item in enumerate(value):
                rows.extend(metadata_rows(item, f"{name}.{i}."))
        elif isinstance(value, list | tuple):
            rows.append((name, ", ".join(_text(v) for v in value)))
        else:
            rows.append((name, _text(value)))
    return rows


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


class _Reader:
    """Looks keys up in the flattened rows, remembering which it used (a ``null`` value
    counts as absent)."""

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        self.values = {k: v for k, v in rows if v not in ("null", "")}
        self.used: set[str] = set()

    def first(self, keys: tuple[str, ...]) -> str | None:
        for key in keys:
            if key in self.values:
                self.used.add(key)
                return self.values[key]
        return None

    def matching(self, pattern: re.Pattern[str]) -> str | None:
        for key in sorted(self.values):
            if pattern.match(key):
                self.used.add(key)
                return self.values[key]
        return None


def _model(read: _Reader) -> str | None:
    name = read.first(_MODEL)
    if name is not None:
        return name
    layers, width = read.first(("engine.model.n_layer",)), read.first(("engine.model.d_model",))
    return f"{layers} layers × d_model {width}" if layers and width else None


def _device(read: _Reader) -> str | None:
    name = read.matching(_DEVICE_NAME) or read.first(("engine.device_name",))
    kind = read.matching(_DEVICE_TYPE) or read.first(("engine.device",))
    if name is None or kind is None or kind == name:
        return name or kind
    return f"{name} ({kind})"


def _workload(read: _Reader) -> str | None:
    parts = []
    command = read.first(_COMMAND)
    requests = read.first(_REQUESTS)
    if requests is not None:
        parts.append(f"{requests} requests")
    rate, arrival = read.first(_RATE), read.first(("arguments.arrival",))
    if rate is not None:
        parts.append(f"{arrival + ' ' if arrival else ''}at {rate} req/s")
    concurrency = read.first(_CONCURRENCY)
    if concurrency is not None:
        parts.append(f"concurrency {concurrency}")
    prompt = read.first(_PROMPT)
    if prompt is not None:
        parts.append(f"prompts {prompt.replace(', ', '–')} tokens")
    output = read.first(_OUTPUT)
    if output is not None:
        parts.append(f"{output} output tokens")
    if command is None and not parts:
        return None
    return ", ".join([command or "a run"] + parts) if parts else command


def metadata_summary(metadata: Mapping[str, Any]) -> str:
    """One line saying what the run was: ``model …``, ``device …``, ``workload …`` where
    the metadata has them, then how many of its `metadata_rows` the line does not show
    (e.g. ``model small · device AMD EPYC (cpu) · workload ttft trace, 40 requests, poisson
    at 1.63 req/s, prompts 80–400 tokens, 16 output tokens · 58 more keys``); ``no run
    metadata`` for an empty mapping."""
    rows = metadata_rows(metadata)
    if not rows:
        return "no run metadata"
    read = _Reader(rows)
    found = [(label, value) for label, value in (
        ("model", _model(read)), ("device", _device(read)), ("workload", _workload(read)))
        if value is not None]
    rest = len(rows) - len(read.used)
    tail = f"{rest:,} {'more ' if found else ''}key{'' if rest == 1 else 's'}"
    return " · ".join([*(f"{label} {value}" for label, value in found), tail])
