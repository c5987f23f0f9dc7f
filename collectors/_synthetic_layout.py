"""The layout of a synthetic trace (the one ``synthetic``'s docstring describes): every
duration drawn and every interval placed with numpy, per request and per cohort; no Arrow."""

from __future__ import annotations

import numpy as np

RATE_PER_S = 20.0
PREFIX_HIT_FRACTION = 0.3
CHUNK_BUDGET_TOKENS = 1024
_T0_NS = 1_700_000_000_000_000_000
_MS = 1_000_000
_US = 1_000


def layout(n: int, seed: int) -> dict:
    """Draw every duration of ``n`` requests and place every interval; no Arrow yet."""
    rng = np.random.default_rng(seed)

    def uni(lo: int, hi: int, size: int | tuple[int, int]) -> np.ndarray:
        return rng.integers(lo, hi, size, endpoint=True, dtype=np.int64)

    # Cohorts: consecutive arrivals admitted together, sharing their chunk iterations.
    sizes = rng.choice(np.arange(1, 5), size=n, p=[0.4, 0.3, 0.2, 0.1])
    m = int(np.searchsorted(np.cumsum(sizes), n)) + 1
    sizes = sizes[:m]
    sizes[-1] -= sizes.sum() - n
    starts = np.zeros(m + 1, np.int64)
    starts[1:] = np.cumsum(sizes)
    cohort = np.repeat(np.arange(m), sizes)
    k = rng.choice(np.arange(1, 4), size=m, p=[0.5, 0.3, 0.2])
    chunk = np.arange(3)
    live = chunk < k[:, None]  # (m, 3): chunk i exists
    step0 = np.cumsum(2 * k - 1) - (2 * k - 1)  # chunk i: step step0 + 2i; gap after it: + 1

    # Prompts: the uncached part fills k chunks of at most CHUNK_BUDGET_TOKENS.
    uncached = (k[cohort] - 1) * CHUNK_BUDGET_TOKENS + uni(16, CHUNK_BUDGET_TOKENS, n)
    cached = np.where(rng.random(n) < PREFIX_HIT_FRACTION, 16 * uni(4, 256, n), 0)
    tokens = np.clip(uncached[:, None] - chunk * CHUNK_BUDGET_TOKENS, 0, CHUNK_BUDGET_TOKENS)
    context = cached[:, None] + np.cumsum(tokens, axis=1)  # positions the chunk attends to
    prefill_tokens = np.add.reduceat(tokens, starts[:-1], axis=0)
    attention = np.add.reduceat(tokens * context, starts[:-1], axis=0)

    # Client and the server up to the end of queueing.
    c0 = _T0_NS + np.cumsum(rng.exponential(1e9 / RATE_PER_S, n)).astype(np.int64)
    wait = np.where(rng.random(n) < 0.3, uni(100 * _US, 20 * _MS, n), 0)
    conn = np.where(rng.random(n) < 0.25, uni(500 * _US, 5 * _MS, n), 0)
    overhead = uni(20 * _US, 150 * _US, n)
    d = uni(200 * _US, 8 * _MS, n)
    t0 = uni(30 * _US, 300 * _US, n)
    has_tok = rng.random(n) < 0.95
    tok = np.where(has_tok, (uncached + cached) * uni(1 * _US, 3 * _US, n), 0)
    g1 = np.where(rng.random(n) < 0.25, uni(20 * _US, 500 * _US, n), 0)
    sent = c0 + conn + overhead
    s = sent + d
    q0 = s + t0 + tok + g1

    # Cohort iterations: admission, schedule, chunks with gaps, gpu work.
    q1 = np.maximum.reduceat(q0, starts[:-1]) + _US + rng.exponential(10 * _MS, m).astype(np.int64)
    sch = uni(50 * _US, 400 * _US, m)
    dur = (1.5 * _MS + 35 * _US * prefill_tokens + 2 * attention) * rng.uniform(0.9, 1.1, (m, 3))
    dur = np.where(live, dur.astype(np.int64), 0)
    gap = np.where(live[:, 1:], uni(3 * _MS, 30 * _MS, (m, 2)), 0)
    cs = np.empty((m, 3), np.int64)
    cs[:, 0] = q1 + sch
    cs[:, 1] = cs[:, 0] + dur[:, 0] + gap[:, 0]
    cs[:, 2] = cs[:, 1] + dur[:, 1] + gap[:, 1]
    ce = cs + dur
    last = np.arange(m), k - 1
    pe = ce[last]
    fs = cs + uni(100 * _US, 600 * _US, (m, 3))
    fe = fs + ((ce - fs) * rng.uniform(0.2, 0.6, (m, 3))).astype(np.int64)
    gs = fs + uni(20 * _US, 100 * _US, (m, 3))
    ge = ce - uni(50 * _US, 300 * _US, (m, 3))
    ov = uni(100 * _US, 1500 * _US, m)
    ge[last] = pe + ov
    gpu_in = np.where(live, np.minimum(ge, ce) - gs, 0).sum(axis=1)

    # First token: sample (outlasting the gpu tail), detokenize, stream, then the client.
    samp = ov[cohort] + uni(30 * _US, 400 * _US, n)
    se = pe[cohort] + samp
    det = uni(5 * _US, 60 * _US, n)
    strm = uni(20 * _US, 300 * _US, n)
    fb = se + det + strm
    ft = fb + d
    itl = uni(8 * _MS, 40 * _MS, n)[:, None] * rng.uniform(0.7, 1.3, (n, 3))
    token_ns = ft[:, None] + np.cumsum(itl.astype(np.int64), axis=1)
    tail = uni(50 * _US, 500 * _US, n)

    c = cohort
    parts = {
        "network": overhead + 2 * d, "connect": conn, "server": t0 + g1, "tokenize": tok,
        "queue": q1[c] - q0, "schedule": sch[c], "prefill": gap.sum(axis=1)[c],
        "prefill.chunk": (dur.sum(axis=1) - gpu_in)[c], "gpu_in": gpu_in[c], "ov": ov[c],
        "sample": samp, "detokenize": det, "stream": strm, "unattributed": np.where(has_tok, g1, 0),
    }
    return {
        "n": n, "m": m, "seed": seed, "starts": starts, "cohort": cohort, "k": k, "live": live,
        "step0": step0,
        "cached": cached, "prompt": uncached + cached, "tokens": tokens, "context": context,
        "prefill_tokens": prefill_tokens, "c0": c0, "wait": wait, "conn": conn, "sent": sent,
        "s": s, "t0": t0, "has_tok": has_tok, "tok": tok, "q0": q0, "q1": q1, "sch": sch,
        "cs": cs, "ce": ce, "fs": fs, "fe": fe, "gs": gs, "ge": ge, "gap": gap, "se": se,
        "det": det, "fb": fb, "ft": ft, "d": d, "token_ns": token_ns, "tail": tail,
        "parts": parts,
    }
