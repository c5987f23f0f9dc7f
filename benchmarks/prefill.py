"""Prefill throughput and achieved FLOP/s, whole-prompt and chunked, beside measured matmul.

    python benchmarks/prefill.py [--lengths 128 256 512 1024 2048 4096] [--repeats 3]
                                 [--preset small] [--chunks 256 1024]

On the CPU, in float32: for each prompt length, ``ttft.engine.prefill`` of the whole prompt
and in chunks (only chunk sizes below the length; one chunk is the whole prompt), the
median of ``--repeats`` runs after one warm-up, as seconds, tokens/s and GFLOP/s (counted
by ``prefill_flops``). The reference is this machine's float32 matmul FLOP/s on the model's
own GEMM shapes (one layer's projections and MLP at 1024 tokens, ``torch.matmul``, same
threads), timed in the same loop as each length's prefill runs, interleaved with them, so
that a slow spell of a shared machine falls on both alike. Goals on CPU: ≥ 60% of that at
1024 tokens and above (whole prompt), and chunked prefill (chunks ≥ 256) within 15% of
whole-prompt time. Where CUDA is available, also the ``base`` preset's prefill MFU in
bfloat16 against a bfloat16 matmul measured in the same run. Prints figures and whether
each goal was met; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from ttft.engine import ModelConfig, PagedKVCache, Transformer, prefill

BLOCK_SIZE = 16
MATMUL_TOKENS = 1024
GOAL_FRACTION_OF_MATMUL = 0.60
GOAL_MIN_LENGTH = 1024
GOAL_CHUNK_RATIO = 1.15
GOAL_MIN_CHUNK = 256


def prefill_flops(config: ModelConfig, prompt_len: int, chunk_len: int | None = None) -> int:
    """Useful FLOPs of prefilling a ``prompt_len`` prompt in chunks of ``chunk_len`` (one
    chunk when None). Multiply-adds count as 2 FLOPs; norms, rotary, softmax and
    elementwise work are not counted.

    Per chunk of ``T`` new tokens after ``P`` cached ones, per layer:

    * projections and MLP: ``2 × (wq + wk + wv + wo + w1 + w2 + w3 parameters) × T``;
    * causal attention: ``QK^T`` and ``AV`` each ``2 × n_head × head_dim × S``, where
      ``S = Σ_{p=P}^{P+T-1} (p + 1) = T·P + T(T+1)/2`` is the number of (query, key) pairs
      a causal mask keeps (GQA repeats K/V heads, so ``n_head`` heads do the arithmetic);

    plus, once per chunk (``prefill_chunk`` returns the last position's logits only),
    the output head ``2 × d_model × vocab_size``. The embedding lookup is free.
    """
    c = config
    kv_dim = c.n_kv_head * c.head_dim
    attn_params = 2 * c.d_model * c.d_model + 2 * c.d_model * kv_dim  # wq, wo; wk, wv
    mlp_params = 3 * c.d_model * c.d_ff  # w1, w3, w2
    step = chunk_len or prompt_len
    total = 0
    for start in range(0, prompt_len, step):
        T, P = min(step, prompt_len - start), start
        pairs = T * P + T * (T + 1) // 2
        per_layer = 2 * (attn_params + mlp_params) * T + 2 * (2 * c.n_head * c.head_dim * pairs)
        total += c.n_layer * per_layer + 2 * c.d_model * c.vocab_size
    return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_ns(fn: Callable[[], object], device: torch.device) -> int:
    """Wall time of one call of ``fn``. On CUDA the device is synchronized before and
    after, so this is device completion time, not host enqueue time."""
    _sync(device)
    start_ns = time.perf_counter_ns()
    fn()
    _sync(device)
    return time.perf_counter_ns() - start_ns


def _median_ns(fn: Callable[[], object], repeats: int, device: torch.device) -> int:
    """Median of ``repeats`` timed calls of ``fn`` (see ``_time_ns``) after one warm-up."""
    _time_ns(fn, device)
    return int(statistics.median(_time_ns(fn, device) for _ in range(repeats)))


def model_gemms(
    config: ModelConfig, tokens: int, dtype: torch.dtype, device: torch.device
) -> tuple[Callable[[], None], int]:
    """One layer's GEMMs as the model runs them (``x @ W.T`` with ``tokens`` rows: wq, wk,
    wv, wo, w1, w3, w2), five passes, with ``torch.matmul``.

    Returns:
        A function that runs them, and the FLOPs it does.
    """
    c = config
    kv_dim = c.n_kv_head * c.head_dim
    shapes = [  # (in_features, out_features)
        (c.d_model, c.d_model),
        (c.d_model, kv_dim),
        (c.d_model, kv_dim),
        (c.d_model, c.d_model),
        (c.d_model, c.d_ff),
        (c.d_model, c.d_ff),
        (c.d_ff, c.d_model),
    ]
    gen = torch.Generator().manual_seed(0)
    pairs = [
        (
            torch.randn(tokens, k, generator=gen).to(device, dtype),
            torch.randn(n, k, generator=gen).to(device, dtype),
        )
        for k, n in shapes
    ]
    # Several passes so that one timing is well above timer and launch noise.
    passes = 5

    def run() -> None:
        for _ in range(passes):
            for x, w in pairs:
                torch.matmul(x, w.t())

    return run, passes * sum(2 * tokens * k * n for k, n in shapes)


def square_matmul(
    n: int, dtype: torch.dtype, device: torch.device, passes: int = 1
) -> tuple[Callable[[], None], int]:
    """``passes`` ``(n, n) @ (n, n)`` ``torch.matmul``s: a function that runs them, and its
    FLOPs."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def run() -> None:
        for _ in range(passes):
            torch.matmul(a, b)

    return run, passes * 2 * n**3


def measure_prefill(
    model: Transformer,
    lengths: list[int],
    chunks: list[int],
    repeats: int,
    reference: tuple[Callable[[], None], int],
) -> list[dict]:
    """One row per (length, mode): median prefill time, the FLOPs it did, and the reference
    matmul's FLOP/s measured alongside.

    For each length every mode and the reference ``(run, flops)`` are warmed up once, then
    timed in turn ``repeats`` times (whole, chunk a, chunk b, reference, whole, ...), so a
    slow spell of a shared machine falls on all of them alike and the ratios stay fair.
    Each prefill allocates a fresh sequence and frees its blocks on return, so every run
    starts from an empty cache.
    """
    device = model.device
    cache = PagedKVCache.for_model(model, -(-max(lengths) // BLOCK_SIZE), BLOCK_SIZE)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ref_run, ref_flops = reference
    rows = []
    for length in lengths:
        token_ids = torch.randint(0, vocab, (length,), generator=gen).tolist()
        modes: list[int | str | None] = [None, *(c for c in chunks if c < length)]
        runs: dict[int | str | None, Callable[[], object]] = {
            chunk: (lambda c=chunk, ids=token_ids: prefill(model, cache, ids, c)) for chunk in modes
        }
        runs["reference"] = ref_run
        for run in runs.values():
            _time_ns(run, device)  # warm-up
        times_ns: dict[int | str | None, list[int]] = {key: [] for key in runs}
        for _ in range(repeats):
            for key, run in runs.items():
                times_ns[key].append(_time_ns(run, device))
        if cache.allocator.num_free != cache.num_blocks:
            raise RuntimeError("prefill left blocks allocated; the runs would not be equal")
        whole_ns = statistics.median(times_ns[None])
        ref_flops_per_s = ref_flops / (statistics.median(times_ns["reference"]) / 1e9)
        for chunk in modes:
            dur_ns = int(statistics.median(times_ns[chunk]))
            rows.append(
                dict(
                    length=length,
                    chunk=chunk,
                    dur_ns=dur_ns,
                    flops=prefill_flops(model.config, length, chunk),
                    ratio=dur_ns / whole_ns,
                    ref_flops_per_s=ref_flops_per_s,
                )
            )
    return rows


def print_table(rows: list[dict], ref_name: str) -> None:
    print(
        f"{'length':>7}  {'mode':<11}{'seconds':>9}{'tokens/s':>11}{'GFLOP/s':>10}"
        f"{ref_name + ' GFLOP/s':>{len(ref_name) + 10}}{'% ' + ref_name:>{len(ref_name) + 8}}"
        f"{'chunk/whole':>13}"
    )
    for r in rows:
        dur_s = r["dur_ns"] / 1e9
        flops_per_s = r["flops"] / dur_s
        mode = "whole" if r["chunk"] is None else f"chunk {r['chunk']}"
        ratio = "" if r["chunk"] is None else f"{r['ratio']:.3f}"
        print(
            f"{r['length']:>7}  {mode:<11}{dur_s:>9.3f}{r['length'] / dur_s:>11,.0f}"
            f"{flops_per_s / 1e9:>10,.1f}{r['ref_flops_per_s'] / 1e9:>{len(ref_name) + 10},.1f}"
            f"{100 * flops_per_s / r['ref_flops_per_s']:>{len(ref_name) + 7}.1f}%{ratio:>13}"
        )


def print_goals(rows: list[dict]) -> list:
    from _figures import Figure

    figures = []
    big = [r for r in rows if r["chunk"] is None and r["length"] >= GOAL_MIN_LENGTH]
    fractions = {r["length"]: r["flops"] / (r["dur_ns"] / 1e9) / r["ref_flops_per_s"] for r in big}
    if fractions:
        worst = min(fractions, key=fractions.get)
        met = all(f >= GOAL_FRACTION_OF_MATMUL for f in fractions.values())
        print(
            f"goal: whole prompt ≥ {GOAL_FRACTION_OF_MATMUL:.0%} of matmul FLOP/s at "
            f"≥ {GOAL_MIN_LENGTH} tokens: {'met' if met else 'NOT met'} "
            f"(lowest {fractions[worst]:.1%} at {worst} tokens)"
        )
        figures.append(Figure("prefill (CPU)", f"whole prompt / matmul FLOP/s, lowest at "
                              f"≥ {GOAL_MIN_LENGTH} tokens ({worst})", fractions[worst], "×",
                              f"≥ {GOAL_FRACTION_OF_MATMUL:g}", met))
        top = max(big, key=lambda r: r["length"])
        figures.append(Figure("prefill (CPU)", f"prefill FLOP/s at {top['length']} tokens",
                              top["flops"] / (top["dur_ns"] / 1e9) / 1e9, "GFLOP/s"))
    else:
        print(f"goal: ≥ {GOAL_FRACTION_OF_MATMUL:.0%} of matmul: no length ≥ {GOAL_MIN_LENGTH}")
    chunked = [r for r in rows if r["chunk"] is not None and r["chunk"] >= GOAL_MIN_CHUNK]
    if chunked:
        worst_row = max(chunked, key=lambda r: r["ratio"])
        met = worst_row["ratio"] <= GOAL_CHUNK_RATIO
        print(
            f"goal: chunked (≥ {GOAL_MIN_CHUNK}) within {GOAL_CHUNK_RATIO - 1:.0%} of whole "
            f"prompt time: {'met' if met else 'NOT met'} (worst {worst_row['ratio']:.3f}× "
            f"at {worst_row['length']} tokens, chunk {worst_row['chunk']})"
        )
        figures.append(Figure("prefill (CPU)", f"chunked / whole prompt time, worst (chunk "
                              f"{worst_row['chunk']} at {worst_row['length']})",
                              worst_row["ratio"], "×", f"≤ {GOAL_CHUNK_RATIO:g}", met))
    else:
        print("goal: chunked within 15% of whole: no chunk size below a prompt length")
    return figures


def cpu_section(args: argparse.Namespace) -> list:
    config = ModelConfig.preset(args.preset, max_seq_len=max(args.lengths))
    device = torch.device("cpu")
    threads = torch.get_num_threads()
    square_run, square_flops = square_matmul(2048, torch.float32, device)
    square = square_flops / (_median_ns(square_run, max(5, args.repeats), device) / 1e9)
    model = Transformer.from_config(config, device=device)
    reference = model_gemms(config, MATMUL_TOKENS, torch.float32, device)
    rows = measure_prefill(model, args.lengths, args.chunks, args.repeats, reference)
    print(
        f"CPU, float32, {threads} threads; preset {args.preset!r} "
        f"({config.n_layer} layers, d_model {config.d_model}, d_ff {config.d_ff}, "
        f"heads {config.n_head}/{config.n_kv_head}, vocab {config.vocab_size}); "
        f"median of {args.repeats} after one warm-up"
    )
    print(
        f"matmul: one layer's GEMMs at {MATMUL_TOKENS} tokens, timed between each length's "
        f"prefill runs (column 'matmul GFLOP/s'); square 2048 @ 2048 before: "
        f"{square / 1e9:.1f} GFLOP/s"
    )
    print()
    print_table(rows, "matmul")
    print()
    return print_goals(rows)


def gpu_section(args: argparse.Namespace) -> None:
    """The ``base`` preset in bfloat16 on CUDA: prefill MFU against the bf16 peak measured
    alongside (20 square 8192 matmuls per timing)."""
    device = torch.device("cuda")
    config = ModelConfig.preset("base", max_seq_len=max(4096, *args.lengths))
    model = Transformer.from_config(config, device=device)
    peak = square_matmul(8192, torch.bfloat16, device, passes=20)
    rows = measure_prefill(model, args.lengths, args.chunks, args.repeats, peak)
    print()
    print(
        f"CUDA ({torch.cuda.get_device_name(device)}), bfloat16, preset 'base' "
        f"({config.n_layer} layers, d_model {config.d_model}); times synchronized (device "
        f"completion); peak: square 8192 bf16 matmul timed between each length's runs; "
        f"'% peak' is MFU"
    )
    print()
    print_table(rows, "peak")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the median counts")
    parser.add_argument("--preset", default="small", choices=sorted(ModelConfig.PRESETS))
    parser.add_argument("--chunks", type=int, nargs="+", default=[256, 1024])
    from _figures import add_json_option, write  # benchmarks/ is the script's folder

    add_json_option(parser)
    args = parser.parse_args()
    if min(args.lengths) < 1 or min(args.chunks) < 1 or args.repeats < 1:
        parser.error("lengths, chunks and repeats must be positive")

    with torch.inference_mode():
        figures = cpu_section(args)
        if torch.cuda.is_available():
            gpu_section(args)
    write(args.json, figures)


if __name__ == "__main__":
    main()
