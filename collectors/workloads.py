"""Workloads for the load generator: arrival patterns, generated prompts of given token
lengths (optionally sharing prefixes), and replay of request traces such as Mooncake's.

Generated prompts are text built from a fixed word list, one deterministic stream per key,
so equal keys give equal text (and equal prefix-cache blocks on the server). Their length
is first approximate (a word stands in for a token); :func:`fit_prompts` then makes each
prompt exactly its target length through the server's tokenizer endpoint when it has one
(vLLM's, llama-cpp-python's or TGI's dialect, ``collectors._server_tokenizer``).
("Synthetic" in ttft means the synthetic trace generator, ``collectors.synthetic``, only.)
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx
import numpy as np

from ttft.collectors._server_tokenizer import ServerTokenizer, TokenizerUnavailable

__all__ = [
    "BLOCK_TOKENS", "PromptFit", "WorkItem", "Workload", "burst", "constant", "fit_prompts",
    "fit_to_server", "generated_prompts", "poisson", "read_replay", "workload",
]

BLOCK_TOKENS = 512
"""Tokens per Mooncake prefix block (``hash_ids``)."""


@dataclass(frozen=True)
class WorkItem:
    """One request of a workload.

    Attributes:
        arrival_s: offset from the run's start at which the request is due.
        prompt: prompt text, or token ids (sent as the completion ``prompt`` as they are).
        max_tokens: the most tokens to generate.
        group: optional prefix-group label (requests of one group share a prompt prefix).
        target_tokens: the prompt length asked for, in tokens (None: not specified).
        shared_chars: the first ``shared_chars`` characters of a text prompt are shared
            with other requests and must stay as they are when the length is fitted.
        exact: True once the server's tokenizer confirmed ``target_tokens``.
    """

    arrival_s: float
    prompt: str | list[int]
    max_tokens: int
    group: str | None = None
    target_tokens: int | None = None
    shared_chars: int = 0
    exact: bool = False


Workload = Sequence[WorkItem]


def workload(offsets_s: Sequence[float], prompts: Sequence[str | list[int]],
             max_tokens: int) -> list[WorkItem]:
    """Pair arrival offsets with prompts (cycled) into a workload of ``len(offsets_s)``."""
    if not prompts:
        raise ValueError("prompts must not be empty")
    return [WorkItem(float(t), prompts[i % len(prompts)], max_tokens)
            for i, t in enumerate(offsets_s)]


# -- arrival patterns ---------------------------------------------------------------------

def poisson(rate_per_s: float, n: int, seed: int = 0) -> list[float]:
    """``n`` arrival offsets (s) of a Poisson process: exponential gaps of mean
    ``1/rate_per_s`` from a seeded generator; the first arrival is at 0."""
    if not rate_per_s > 0 or n < 0:
        raise ValueError(f"need rate_per_s > 0 and n >= 0, got {rate_per_s}, {n}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, size=n)
    if n:
        gaps[0] = 0.0
    return [float(x) for x in np.cumsum(gaps)]


def constant(rate_per_s: float, n: int) -> list[float]:
    """``n`` arrival offsets (s), evenly ``1/rate_per_s`` apart, from 0."""
    if not rate_per_s > 0 or n < 0:
        raise ValueError(f"need rate_per_s > 0 and n >= 0, got {rate_per_s}, {n}")
    return [i / rate_per_s for i in range(n)]


def burst(n: int) -> list[float]:
    """``n`` arrivals all at 0; with ``run(concurrency=N)`` this is a closed loop: a new
    request starts as soon as one finishes."""
    if n < 0:
        raise ValueError(f"need n >= 0, got {n}")
    return [0.0] * n


# -- replay ---------------------------------------------------------------------------------

_WORDS = (
    "the a of and to in is it that was for on are with as his they be at one have this from "
    "or had by word but what some we can out other were all there when up use your how said "
    "an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound "
    "no most people my over know water than call first who may down side been now find"
).split()


def _block_words(key: str, n_words: int) -> list[str]:
    rng = random.Random(key)  # str seeds hash deterministically (sha512), not per process
    return [rng.choice(_WORDS) for _ in range(n_words)]


def _replay_rows(path: str) -> list[tuple[int, dict[str, Any]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    with open(path, newline="") as f:
        if path.endswith(".csv"):
            for row in csv.DictReader(f):
                rows.append((len(rows) + 2, dict(row)))  # line 1 is the header
        else:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{path}:{lineno}: not a JSON object ({exc})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{lineno}: not a JSON object")
                rows.append((lineno, row))
    return rows


def _hash_ids(value: Any) -> list[int] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):  # CSV: "[1, 2, 3]" or "1 2 3"
        value = json.loads(value) if value.lstrip().startswith("[") else value.split()
    if not isinstance(value, list):
        raise ValueError("hash_ids is not a list")
    return [int(v) for v in value]


def read_replay(path: str | os.PathLike[str], *, scale_tokens: float = 1.0,
                scale_time: float = 1.0, limit: int | None = None) -> list[WorkItem]:
    """A workload from a request trace (Mooncake JSONL, or CSV with the same columns).

    Columns: ``timestamp`` (ms), ``input_length`` and ``output_length`` (tokens), optional
    ``hash_ids`` (512-token prefix blocks; equal ids mean equal prompt prefixes). Prompts are
    built from one deterministic text block per hash id (``512 * scale_tokens`` words each,
    a word standing in for a token), so requests sharing ids share prompt prefixes; rows
    without ``hash_ids`` get text of their own. Arrival offsets are ``(timestamp - first
    timestamp) * scale_time`` in seconds; ``scale_tokens`` scales prompt and output lengths
    (at least 1 each). A ``.csv`` suffix selects CSV, anything else JSONL.

    Raises:
        ValueError: a row that is not valid; the message names the file and the line.
        OSError: the file cannot be read.
    """
    if not scale_tokens > 0 or not scale_time >= 0:
        raise ValueError(f"need scale_tokens > 0 and scale_time >= 0, got {scale_tokens}, "
                         f"{scale_time}")
    path = os.fspath(path)
    block_words = max(1, round(BLOCK_TOKENS * scale_tokens))
    items: list[WorkItem] = []
    first_ms: float | None = None
    for lineno, row in _replay_rows(path):
        if limit is not None and len(items) >= limit:
            break
        try:
            timestamp_ms = float(row["timestamp"])
            input_tokens, output_tokens = int(row["input_length"]), int(row["output_length"])
            ids = _hash_ids(row.get("hash_ids"))
            if input_tokens < 1 or output_tokens < 0 or not timestamp_ms >= 0:
                raise ValueError("negative or zero length, or a bad timestamp")
        except KeyError as exc:
            raise ValueError(f"{path}:{lineno}: missing column {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{lineno}: bad row ({exc})") from None
        first_ms = timestamp_ms if first_ms is None else first_ms
        n_words = max(1, round(input_tokens * scale_tokens))
        keys = [f"block-{h}" for h in ids] if ids else [f"row-{lineno}-{i}" for i in
                                                        range(-(-n_words // block_words))]
        words: list[str] = []
        for key in keys:
            if len(words) >= n_words:
                break
            words.extend(_block_words(key, block_words))
        while len(words) < n_words:  # fewer hash ids than the length needs
            words.extend(_block_words(f"row-{lineno}-{len(words)}", block_words))
        shared = min(n_words, len(ids) * block_words) if ids else 0
        items.append(WorkItem(
            arrival_s=(timestamp_ms - first_ms) * scale_time / 1000.0,
            prompt=" ".join(words[:n_words]),
            max_tokens=max(1, round(output_tokens * scale_tokens)),
            group=str(ids[0]) if ids else None,
            target_tokens=n_words,
            shared_chars=len(" ".join(words[:shared])),
        ))
    return items


# -- generated prompts ------------------------------------------------------------------------

def generated_prompts(offsets_s: Sequence[float], *, prompt_tokens: tuple[int, int],
                      max_tokens: int, shared_prefix: tuple[int, int] | None = None,
                      prefix_tokens: int | None = None, shared_fraction: float = 1.0,
                      seed: int = 0) -> list[WorkItem]:
    """A workload of generated text prompts (from the word list, seeded) with lengths drawn
    uniformly from ``prompt_tokens``.

    With ``shared_prefix=(P, S)`` there are P prefixes of ``prefix_tokens`` tokens (default:
    half the shortest prompt) and S suffixes for each; request ``i`` uses prompt ``i mod
    (P*S)`` of a seeded shuffle, so each prefix is reused by about ``1/P`` of the requests
    (prefix-cache hits) while every full prompt repeats only after ``P*S`` requests. With
    ``shared_fraction`` below 1, each request takes a shared prefix with that probability
    and an unshared prompt otherwise (a mix of cold and prefix-hit requests).

    Raises:
        ValueError: lengths or counts that are not positive, or a prefix as long as a prompt.
    """
    lo, hi = prompt_tokens
    if not 1 <= lo <= hi or max_tokens < 1:
        raise ValueError(f"need 1 <= prompt tokens A <= B and max_tokens >= 1, got "
                         f"{prompt_tokens}, {max_tokens}")
    rng = random.Random(seed)
    if shared_prefix is None:
        return [WorkItem(float(t), _text(f"p{seed}-{i}", n), max_tokens, target_tokens=n)
                for i, t in enumerate(offsets_s) for n in [rng.randint(lo, hi)]]
    n_prefix, n_suffix = shared_prefix
    k = lo // 2 if prefix_tokens is None else prefix_tokens
    if not 0.0 <= shared_fraction <= 1.0:
        raise ValueError(f"shared_fraction must be in [0, 1], got {shared_fraction}")
    if n_prefix < 1 or n_suffix < 1 or not 1 <= k < lo:
        raise ValueError(f"need P >= 1, S >= 1 and 1 <= prefix tokens < {lo} (the shortest "
                         f"prompt), got {n_prefix}:{n_suffix} with {k} prefix tokens")
    combos = [(p, s, rng.randint(lo, hi)) for p in range(n_prefix) for s in range(n_suffix)]
    rng.shuffle(combos)
    items = []
    shared_count = 0
    for i, t in enumerate(offsets_s):
        if shared_fraction < 1.0 and rng.random() >= shared_fraction:
            n = rng.randint(lo, hi)
            items.append(WorkItem(float(t), _text(f"p{seed}-{i}", n), max_tokens,
                                  target_tokens=n))
            continue
        p, s, n = combos[shared_count % len(combos)]
        shared_count += 1
        prefix = _text(f"prefix{seed}-{p}", k)
        items.append(WorkItem(float(t), f"{prefix} {_text(f'suffix{seed}-{p}-{s}', n - k)}",
                              max_tokens, group=f"prefix-{p}", target_tokens=n,
                              shared_chars=len(prefix)))
    return items


def _text(key: str, n_words: int) -> str:
    return " ".join(_block_words(key, n_words))


# -- exact lengths through the server ---------------------------------------------------------

@dataclass(frozen=True)
class PromptFit:
    """What :func:`fit_prompts` made of a workload's prompt lengths.

    Attributes:
        items: the items, fitted when the server counted tokens, else as they were.
        tokenizer: the endpoint that counted (a ``_server_tokenizer`` dialect name, such
            as ``"vLLM /tokenize"``); None when none did or nothing needed counting.
        reason: why the lengths are not all exact, in one line (what each tokenizer
            endpoint answered, how the fit failed, or how many prompts kept the closest
            length); None when they are.
    """

    items: list[WorkItem]
    tokenizer: str | None
    reason: str | None

    @property
    def exact(self) -> bool:
        """True when every text prompt is exactly its ``target_tokens`` long."""
        return self.reason is None


async def fit_prompts(base_url: str, items: Sequence[WorkItem], *, model: str | None = None,
                      api_key: str | None = None, parallel: int = 8,
                      timeout_s: float = 10.0) -> PromptFit:
    """Make every text prompt exactly ``target_tokens`` long by the server's tokenizer, in
    whichever known dialect it speaks (vLLM's ``/tokenize``, llama-cpp-python's
    ``/extras/tokenize/count``, TGI's ``/tokenize``, tried in turn on the first prompt).

    For each item, the words after its shared part are grown or cut (at most a few counts
    each) until the server counts ``target_tokens``; the shared part never changes, so
    prefix sharing survives. Items that cannot be fitted exactly (a tokenizer that merges
    across words) keep the closest length and ``exact=False``.

    Never fails on the server's account: no tokenizer endpoint, any status, a body of
    another shape, a timeout (``timeout_s`` a call) or a broken connection, before or
    during the fit, gives back the items as they were with the reason.
    """
    todo = [i for i, it in enumerate(items)
            if it.target_tokens is not None and isinstance(it.prompt, str)]
    if not todo:
        return PromptFit(list(items), None, None)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as client:
        try:
            tokenizer = await ServerTokenizer.find(client, base_url, str(items[todo[0]].prompt),
                                                   model, parallel)
        except TokenizerUnavailable as exc:
            return PromptFit(list(items), None, f"no tokenizer endpoint counted tokens ({exc})")
        name = tokenizer.dialect.name
        tasks = [asyncio.ensure_future(_fit_one(i, items[i], tokenizer.count)) for i in todo]
        try:
            done = await asyncio.gather(*tasks)
        except TokenizerUnavailable as exc:
            return PromptFit(list(items), None, f"{name} failed during the fit ({exc})")
        finally:  # after a failure the other searches stop at once
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    fitted = list(items)
    for i, item in zip(todo, done, strict=True):
        fitted[i] = item
    missed = sum(1 for i in todo if not fitted[i].exact)
    return PromptFit(fitted, name, f"{missed} of {len(todo)} prompts kept the closest length "
                     f"{name} allows" if missed else None)


async def fit_to_server(base_url: str, items: Sequence[WorkItem], *, model: str | None = None,
                        api_key: str | None = None, parallel: int = 8,
                        timeout_s: float = 10.0) -> list[WorkItem] | None:
    """:func:`fit_prompts`' items, or None when the server counted no tokens (the caller
    keeps the approximate prompts)."""
    fit = await fit_prompts(base_url, items, model=model, api_key=api_key, parallel=parallel,
                            timeout_s=timeout_s)
    return None if fit.tokenizer is None and fit.reason is not None else fit.items


async def _fit_one(index: int, item: WorkItem,
                   count: Callable[[str], Awaitable[int]]) -> WorkItem:
    """Search the number of tail words whose prompt counts ``target_tokens`` tokens."""
    assert isinstance(item.prompt, str) and item.target_tokens is not None
    shared = item.prompt[:item.shared_chars].rstrip()
    tail_words = item.prompt[item.shared_chars:].split()
    stream = tail_words + _block_words(f"fill-{index}-{item.prompt[-16:]}", 4 * item.target_tokens)

    def text(m: int) -> str:
        return " ".join(([shared] if shared else []) + stream[:m])

    target = item.target_tokens
    lo, hi = 0, len(stream)  # the count is nondecreasing in m
    m = min(len(tail_words), hi)
    best = (abs(await count(text(m)) - target), m)
    for _ in range(12):
        n = await count(text(m))
        best = min(best, (abs(n - target), m))
        if n == target:
            return replace(item, prompt=text(m), exact=True)
        lo, hi = (m + 1, hi) if n < target else (lo, m - 1)
        if lo > hi:
            break
        m = max(lo, min(hi, m + (target - n)))  # one word is about one token
    return replace(item, prompt=text(best[1]), exact=False)
