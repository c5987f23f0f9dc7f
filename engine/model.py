"""A compact Llama-style decoder: RMSNorm, rotary embeddings, grouped-query attention,
SwiGLU MLP, with random weights from a seed, run against a paged K/V cache.

``prefill_chunk`` and ``decode_step`` are the two forward entry points (kept separate so
the tracer can wrap each); ``prefill`` and ``greedy`` are conveniences over them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ttft.engine.kv_cache import PagedKVCache, Seq


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 2048  # the engine tokenizer's byte-level BPE vocabulary
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2
    d_model: int = 64
    d_ff: int = 192  # SwiGLU hidden width
    max_seq_len: int = 512
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    PRESETS: ClassVar[dict[str, dict]] = {
        # For tests: 2 layers, d_model 64 (~0.16M parameters).
        "tiny": dict(n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=192, max_seq_len=512),
        # For demos on CPU: 26,223,104 parameters.
        "small": dict(n_layer=8, n_head=8, n_kv_head=2, d_model=512, d_ff=1536, max_seq_len=2048),
        # For GPUs: the Llama-3.2-1B body (16 layers, 2048 wide, GQA 32/8), ~0.97B parameters.
        "base": dict(n_layer=16, n_head=32, n_kv_head=8, d_model=2048, d_ff=8192, max_seq_len=4096),
    }

    def __post_init__(self) -> None:
        if self.d_model % self.n_head or self.n_head % self.n_kv_head:
            raise ValueError(
                f"need n_head | d_model and n_kv_head | n_head, got d_model={self.d_model}, "
                f"n_head={self.n_head}, n_kv_head={self.n_kv_head}"
            )
        if self.head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @classmethod
    def preset(cls, name: str, **overrides) -> ModelConfig:
        """A named configuration (``tiny``, ``small``, ``base``), fields optionally overridden."""
        if name not in cls.PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(cls.PRESETS)}")
        return replace(cls(**cls.PRESETS[name]), **overrides)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` picks CUDA when available, else CPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int) -> torch.Tensor:
    """Causal attention of a chunk of queries against the cached prefix plus the chunk.

    Args:
        q: ``(B, H, Tq, D)``, the queries of positions ``q_start .. q_start+Tq-1``.
        k, v: ``(B, H_kv, q_start+Tq, D)``, keys/values of positions ``0 .. q_start+Tq-1``;
            ``H_kv`` divides ``H`` (grouped-query attention).
        q_start: position of the first query.

    Returns:
        ``(B, H, Tq, D)``: query ``i`` attends to keys ``0 .. q_start+i``.
    """
    Tq, Tk = q.size(2), k.size(2)
    if Tk != q_start + Tq:
        raise ValueError(f"expected {q_start + Tq} keys (q_start {q_start} + {Tq}), got {Tk}")
    # is_causal aligns the mask top-left (query i sees keys 0..i): right when Tq == Tk, and
    # a single query sees every key anyway. Otherwise the mask is offset by q_start.
    mask = None if q_start == 0 or Tq == 1 else _chunk_mask(q_start, Tq, q.dtype, q.device)
    gqa = q.size(1) != k.size(1)
    # SDPA's own GQA avoids copying K/V per query head, but on CUDA a mask together with
    # enable_gqa falls back to the math kernel, so there the heads are repeated instead.
    if gqa and mask is not None and q.device.type != "cpu":
        n_rep = q.size(1) // k.size(1)
        k = k.repeat_interleave(n_rep, dim=1)  # (B, H, Tk, D)
        v = v.repeat_interleave(n_rep, dim=1)
        gqa = False
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None and q_start == 0, enable_gqa=gqa
    )


def _chunk_mask(q_start: int, Tq: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive ``(Tq, q_start+Tq)`` mask: 0 where query ``i`` may see key ``j``
    (``j <= q_start+i``), -inf elsewhere. Float, not bool: SDPA turns a bool mask into
    this on every call."""
    mask = torch.zeros(Tq, q_start + Tq, dtype=dtype, device=device)
    # The cached prefix is visible to every query; only the chunk's own keys are causal.
    mask[:, q_start:] = torch.full((Tq, Tq), float("-inf"), dtype=dtype, device=device).triu(1)
    return mask


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.type_as(x) * self.weight


def rope_tables(config: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's rotation angles, ``(max_seq_len, head_dim/2)`` float32."""
    d = config.head_dim
    inv_freq = 1.0 / config.rope_base ** (torch.arange(0, d, 2, device=device).float() / d)
    angles = torch.outer(torch.arange(config.max_seq_len, device=device).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``(B, T, H, D)`` by per-position angles ``cos``/``sin`` ``(B, T, D/2)``."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (B, T, 1, D/2)
    x1, x2 = x.float().chunk(2, dim=-1)
    y = torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)
    return y.type_as(x)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_dim = config.head_dim
        kv_dim = config.n_kv_head * config.head_dim
        self.wq = nn.Linear(config.d_model, config.d_model, bias=False)
        self.wk = nn.Linear(config.d_model, kv_dim, bias=False)
        self.wv = nn.Linear(config.d_model, kv_dim, bias=False)
        self.wo = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: PagedKVCache,
        layer: int,
        seqs: list[Seq],
    ) -> torch.Tensor:
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_head, self.head_dim)  # (B, T, H, D)
        k = self.wk(x).view(B, T, self.n_kv_head, self.head_dim)  # (B, T, H_kv, D)
        v = self.wv(x).view(B, T, self.n_kv_head, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q = q.transpose(1, 2)  # (B, H, T, D)
        out = []
        # Each row has its own cached length; correctness first, so one attend per row.
        for b, seq in enumerate(seqs):
            cache.write(layer, seq.blocks, seq.length, k[b], v[b])
            # Views of the cache where the blocks are consecutive; read before the next write.
            k_all, v_all = cache._prefix(layer, seq.blocks, seq.length + T)  # (1, H_kv, L, D)
            out.append(attend(q[b : b + 1], k_all, v_all, seq.length))  # (1, H, T, D)
        y = torch.cat(out).transpose(1, 2).reshape(B, T, C)
        return self.wo(y)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff, bias=False)  # gate
        self.w3 = nn.Linear(config.d_model, config.d_ff, bias=False)  # up
        self.w2 = nn.Linear(config.d_ff, config.d_model, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.feed_forward = MLP(config)

    def forward(self, x, cos, sin, cache, layer, seqs) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, layer, seqs)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        cos, sin = rope_tables(config, torch.device("cpu"))
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq_len, D/2) float32
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.output.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.output.weight.dtype

    @classmethod
    def from_config(
        cls, config: ModelConfig, seed: int = 0, device: str | torch.device = "cpu"
    ) -> Transformer:
        """Random weights drawn on the CPU from ``seed`` (the same on every device), then
        moved to ``device``: float32 on CPU, bfloat16 on CUDA. Inference only (no grads)."""
        with torch.device("meta"):
            model = cls(config)
        model.to_empty(device="cpu")
        gen = torch.Generator().manual_seed(seed)
        out_std = 1.0 / math.sqrt(2 * config.n_layer)  # residual branches add up over layers
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name == "tok_embeddings.weight":
                    p.normal_(0.0, 1.0, generator=gen)
                else:
                    std = 1.0 / math.sqrt(p.size(1))
                    if name.endswith(("wo.weight", "w2.weight")):
                        std *= out_std
                    p.normal_(0.0, std, generator=gen)
        return model._place(device)

    @classmethod
    def from_safetensors(
        cls, config: ModelConfig, path: str | Path, device: str | torch.device = "cpu"
    ) -> Transformer:
        """Weights from a local safetensors file keyed by this module's parameter names.

        Raises:
            ImportError: when the optional ``safetensors`` package is not installed.
        """
        try:
            from safetensors.torch import load_file
        except ImportError as e:
            raise ImportError(
                "loading weights needs the optional 'safetensors' package; "
                "use Transformer.from_config() for random weights"
            ) from e
        with torch.device("meta"):
            model = cls(config)
        model.to_empty(device="cpu")
        model.load_state_dict(load_file(str(path), device="cpu"), strict=True)
        return model._place(device)

    def _place(self, device: str | torch.device) -> Transformer:
        device = resolve_device(device)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.to(device=device, dtype=dtype).eval().requires_grad_(False)
        # Recomputed after the cast: the angles stay float32 whatever the weights' dtype.
        self.rope_cos, self.rope_sin = rope_tables(self.config, device)
        return self

    def forward(self, tokens: torch.Tensor, cache: PagedKVCache, seqs: list[Seq]) -> torch.Tensor:
        """Run ``tokens`` ``(B, T)``, row ``b`` at positions ``seqs[b].length ..``; writes
        their K/V into ``cache`` (which must have room) but does not advance the lengths.

        Returns:
            ``(B, vocab_size)`` logits of each row's last position, in the model dtype.
        """
        B, T = tokens.shape
        start = torch.tensor([s.length for s in seqs], device=tokens.device)
        pos = start[:, None] + torch.arange(T, device=tokens.device)  # (B, T)
        if int(pos.max()) >= self.config.max_seq_len:
            raise ValueError(f"position {int(pos.max())} >= max_seq_len {self.config.max_seq_len}")
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]  # (B, T, D/2)
        x = self.tok_embeddings(tokens)  # (B, T, C)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, seqs)
        return self.output(self.norm(x[:, -1]))  # (B, V)


@torch.inference_mode()
def prefill_chunk(
    model: Transformer, cache: PagedKVCache, seq: Seq, token_ids: list[int] | torch.Tensor
) -> torch.Tensor:
    """Run a chunk of ``seq``'s prompt against its cached prefix and cache the chunk's K/V.

    Grows ``seq``'s block table as needed (``CacheFull`` leaves ``seq`` unchanged) and
    advances ``seq.length`` by the chunk length.

    Returns:
        ``(vocab_size,)`` float32 logits of the chunk's last position.
    """
    tokens = torch.as_tensor(token_ids, dtype=torch.long, device=model.device).view(1, -1)
    if tokens.size(1) == 0:
        raise ValueError("empty prefill chunk")
    cache.append(seq, tokens.size(1))
    logits = model(tokens, cache, [seq])  # (1, V)
    seq.length += tokens.size(1)
    return logits[0].float()


@torch.inference_mode()
def decode_step(
    model: Transformer, cache: PagedKVCache, seqs: list[Seq], token_ids: list[int] | torch.Tensor
) -> torch.Tensor:
    """One new token for each running sequence, batched (``B = len(seqs)``).

    Returns:
        ``(B, vocab_size)`` float32 logits; each ``seq.length`` advances by one.
    """
    tokens = torch.as_tensor(token_ids, dtype=torch.long, device=model.device).view(-1, 1)
    if tokens.size(0) != len(seqs):
        raise ValueError(f"{tokens.size(0)} tokens for {len(seqs)} sequences")
    for seq in seqs:
        cache.append(seq, 1)
    logits = model(tokens, cache, seqs)  # (B, V)
    for seq in seqs:
        seq.length += 1
    return logits.float()


def prefill(
    model: Transformer,
    cache: PagedKVCache,
    token_ids: list[int],
    chunk_size: int | None = None,
    seq: Seq | None = None,
) -> torch.Tensor:
    """Prefill a whole prompt in chunks of ``chunk_size`` (one chunk when None).

    With ``seq`` None a temporary sequence is used and freed; pass one to keep the K/V.

    Returns:
        ``(vocab_size,)`` float32 logits of the last prompt position.
    """
    if not token_ids:
        raise ValueError("empty prompt")
    owned = seq is None
    seq = cache.allocate() if seq is None else seq
    step = chunk_size or len(token_ids)
    try:
        for i in range(0, len(token_ids), step):
            logits = prefill_chunk(model, cache, seq, token_ids[i : i + step])
    finally:
        if owned:
            cache.free(seq)
    return logits


def greedy(
    model: Transformer,
    cache: PagedKVCache,
    token_ids: list[int],
    max_tokens: int,
    chunk_size: int | None = None,
) -> list[int]:
    """Greedy (argmax) continuation of ``token_ids``, ``max_tokens`` long; frees its blocks."""
    seq = cache.allocate()
    try:
        logits = prefill(model, cache, token_ids, chunk_size, seq=seq)
        out: list[int] = []
        while len(out) < max_tokens:
            out.append(int(logits.argmax()))
            if len(out) < max_tokens:
                logits = decode_step(model, cache, [seq], [out[-1]])[0]
        return out
    finally:
        cache.free(seq)
