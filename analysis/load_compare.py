"""The load of two runs side by side, and whether it was the same: a latency delta between
runs under different load measures the load as much as the change being compared.

Pure functions (no I/O). :func:`load_checks` compares, where both runs say it:

- the **offered load**, from the run metadata ``ttft trace`` and ``ttft demo`` record
  (``arguments``: ``rate`` with its ``arrival``, a closed loop's ``concurrency``, a
  ``burst``, a ``replay``) or ``ttft synth`` records (``rate_per_s``): a different kind of
  arrivals, rates more than :data:`OFFERED_TOLERANCE` apart, another concurrency or burst;
- the **output length** asked for (``arguments.output_tokens``, each request's
  ``max_tokens``);
- the **achieved rate** (``Summary.load``: completed requests / the run's duration): apart
  by more than :data:`ACHIEVED_TOLERANCE` of the smaller and by more than three standard
  errors of two Poisson counts (``rate / sqrt(completed)`` each), so the scatter of two
  runs of one workload is no difference. Not compared between two closed loops of one
  concurrency, whose rate follows from their latency;
- the **prompt-length mix** (each request's ``prompt_tokens``, :func:`prompt_tokens`): a
  two-sample Kolmogorov-Smirnov statistic of at least :data:`KS_MIN_D` with a p-value under
  :data:`KS_ALPHA`, so a mix that only scatters is no difference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ttft.analysis.assemble import Assembly
from ttft.analysis.summary import Summary
from ttft.tracer.schema import ATTR_PROMPT_TOKENS

__all__ = ["ACHIEVED_TOLERANCE", "KS_ALPHA", "KS_MIN_D", "OFFERED_TOLERANCE", "compare_load",
           "ks_two_sample", "load_checks", "offered_load", "prompt_tokens"]

OFFERED_TOLERANCE = 0.01
"""Offered rates further apart than this fraction of the smaller one differ."""
ACHIEVED_TOLERANCE = 0.10
"""Achieved rates further apart than this fraction of the smaller one (and than their
noise) differ."""
KS_MIN_D = 0.1
"""The smallest Kolmogorov-Smirnov distance between two prompt-length mixes that differ."""
KS_ALPHA = 0.01
"""The level of the Kolmogorov-Smirnov test of two prompt-length mixes."""

_LOAD_METRICS = (
    ("requests_per_s", "requests/s", lambda s: s.load and s.load["requests_per_s"]),
    ("output_tokens_per_s", "tokens/s", lambda s: s.load and s.load["output_tokens_per_s"]),
    ("e2e_p50", "ms", lambda s: s.load and s.load["e2e_ms"] and s.load["e2e_ms"]["p50"]),
    ("e2e_p99", "ms", lambda s: s.load and s.load["e2e_ms"] and s.load["e2e_ms"]["p99"]),
    ("goodput_share", "fraction", lambda s: s.goodput and s.goodput["share"]),
    ("goodput_per_s", "requests/s", lambda s: s.goodput and s.goodput["per_s"]),
)


def compare_load(a: Summary, b: Summary) -> pd.DataFrame:
    """Load and goodput of two summaries side by side (``Summary.load``, ``goodput``): one
    row per figure either has (``metric``, ``unit``, ``a``, ``b``, ``delta`` = b - a,
    ``delta_pct`` of a), NaN where a summary lacks it (no client span, no SLOs given).

    Raises:
        ValueError: the summaries' goodput is against different SLOs.
    """
    if a.goodput and b.goodput and a.goodput["slo"] != b.goodput["slo"]:
        raise ValueError("the two summaries' goodput is against different SLOs")
    rows = []
    for metric, unit, get in _LOAD_METRICS:
        va, vb = (np.nan if (v := get(s)) is None else float(v) for s in (a, b))
        if np.isnan(va) and np.isnan(vb):
            continue
        rows.append((metric, unit, va, vb, vb - va, (vb - va) / va * 100 if va else np.nan))
    return pd.DataFrame(rows, columns=["metric", "unit", "a", "b", "delta", "delta_pct"])


def prompt_tokens(asm: Assembly) -> np.ndarray:
    """Each request's prompt length (int64, tokens): the largest ``prompt_tokens`` of its
    ``client``, ``server`` and ``tokenize`` spans, in request order; requests without one
    are left out."""
    rows = asm.rows.of("client", "server", "tokenize", requests_only=True)
    best = np.full(len(asm.requests), -1, np.int64)
    np.maximum.at(best, asm.rows.req[rows], asm.rows.int_attribute(rows, ATTR_PROMPT_TOKENS))
    return best[best >= 0]


def offered_load(metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The load a run offered, from its run metadata: ``kind`` (``poisson``, ``constant``,
    ``closed loop``, ``burst`` or ``replay``) and its ``rate_per_s``, ``concurrency``,
    ``burst`` or ``replay`` (with ``scale_time``), plus ``output_tokens`` where the
    metadata names it; None where the metadata says none (an imported trace)."""
    meta = metadata or {}
    args = meta.get("arguments")
    if isinstance(args, Mapping) and str(meta.get("command", "")).startswith("ttft "):
        out: dict[str, Any] = {}
        if args.get("rate"):
            out = {"kind": str(args.get("arrival") or "poisson"),
                   "rate_per_s": float(args["rate"])}
        elif args.get("concurrency"):
            out = {"kind": "closed loop", "concurrency": int(args["concurrency"])}
        elif args.get("burst"):
            out = {"kind": "burst", "burst": int(args["burst"])}
        elif args.get("replay"):
            out = {"kind": "replay", "replay": str(args["replay"]),
                   "scale_time": float(args.get("scale_time") or 1.0)}
        if out and args.get("output_tokens") is not None:
            out["output_tokens"] = int(args["output_tokens"])
        return out or None
    if meta.get("generator") and meta.get("rate_per_s"):
        return {"kind": "poisson", "rate_per_s": float(meta["rate_per_s"])}
    return None


def load_checks(metadata: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None],
                summaries: tuple[Summary, Summary],
                prompts: tuple[np.ndarray, np.ndarray] | None = None) -> list[dict[str, Any]]:
    """Whether runs A and B had the same load (see the module docstring).

    Args:
        metadata: each run's metadata.
        summaries: each run's summary (its ``load``).
        prompts: each run's :func:`prompt_tokens`; None when not known.

    Returns:
        One record per check both runs allow, in the order offered load, output tokens,
        achieved rate, prompt tokens: ``check`` (its name), ``a`` and ``b`` (each side's
        figure, as text), ``differs`` (bool) and ``why`` (the rule, as text).
    """
    out = []
    offered = [offered_load(m) for m in metadata]
    if all(offered):
        a, b = offered
        out.append({"check": "offered load", "a": _describe(a), "b": _describe(b),
                    "differs": not _same_offer(a, b),
                    "why": f"another kind of arrivals, or rates more than "
                           f"{OFFERED_TOLERANCE:.0%} apart"})
        if "output_tokens" in a and "output_tokens" in b:
            out.append({"check": "max output tokens", "a": str(a["output_tokens"]),
                        "b": str(b["output_tokens"]),
                        "differs": a["output_tokens"] != b["output_tokens"],
                        "why": "each request's max_tokens"})
    loads = [s.load for s in summaries]
    closed = all(o and o["kind"] == "closed loop" for o in offered) and _same_offer(*offered)
    if all(x and x.get("requests_per_s") and x.get("requests") for x in loads) and not closed:
        (ra, na), (rb, nb) = ((x["requests_per_s"], x["requests"]) for x in loads)
        noise = 3 * math.sqrt(ra * ra / na + rb * rb / nb)
        differs = abs(ra - rb) > max(ACHIEVED_TOLERANCE * min(ra, rb), noise)
        out.append({"check": "achieved rate", "a": f"{ra:,.2f} requests/s ({na:,})",
                    "b": f"{rb:,.2f} requests/s ({nb:,})", "differs": bool(differs),
                    "why": f"apart by more than {ACHIEVED_TOLERANCE:.0%} and than 3 "
                           f"standard errors ({noise:,.2f} requests/s)"})
    if prompts is not None and all(len(p) for p in prompts):
        d, p = ks_two_sample(*prompts)
        out.append({"check": "prompt tokens", "a": _mix(prompts[0]), "b": _mix(prompts[1]),
                    "differs": bool(d >= KS_MIN_D and p < KS_ALPHA),
                    "why": f"Kolmogorov-Smirnov D {d:.2f} (p {_p_text(p)}); differ at D >= "
                           f"{KS_MIN_D:g} with p < {KS_ALPHA:g}"})
    return out


def ks_two_sample(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """The two-sample Kolmogorov-Smirnov statistic D of ``a`` and ``b`` (non-empty) and its
    asymptotic p-value (the Kolmogorov distribution with Stephens' small-sample factor)."""
    a, b = np.sort(np.asarray(a, np.float64)), np.sort(np.asarray(b, np.float64))
    grid = np.concatenate([a, b])
    d = float(np.abs(np.searchsorted(a, grid, "right") / len(a)
                     - np.searchsorted(b, grid, "right") / len(b)).max())
    en = math.sqrt(len(a) * len(b) / (len(a) + len(b)))
    lam = (en + 0.12 + 0.11 / en) * d
    if lam < 0.2:
        return d, 1.0
    terms = [(-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101)]
    return d, min(1.0, max(0.0, 2 * sum(terms)))


def _same_offer(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    if not a or not b or a["kind"] != b["kind"]:
        return False
    if "rate_per_s" in a:
        low, high = sorted((a["rate_per_s"], b["rate_per_s"]))
        return high - low <= OFFERED_TOLERANCE * low
    keys = ("concurrency", "burst", "replay", "scale_time")
    return all(a.get(k) == b.get(k) for k in keys)


def _describe(offer: Mapping[str, Any]) -> str:
    kind = offer["kind"]
    if "rate_per_s" in offer:
        return f"{kind} arrivals at {offer['rate_per_s']:,.2f} requests/s"
    if kind == "closed loop":
        return f"closed loop of {offer['concurrency']:,}"
    if kind == "burst":
        return f"burst of {offer['burst']:,}"
    return f"replay of {offer['replay']} (time x{offer['scale_time']:g})"


def _mix(tokens: np.ndarray) -> str:
    p10, p50, p90 = np.percentile(tokens, (10, 50, 90))
    return f"median {p50:,.0f} (p10 {p10:,.0f}, p90 {p90:,.0f}) tokens"


def _p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"
