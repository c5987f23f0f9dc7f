"""``LLM``: the public convenience API over one model, its tokenizer and a paged K/V cache.

One request at a time, run on the caller's thread: ``prefill`` (optionally in chunks) for
the last prompt position's logits, ``stream`` to yield sampled token ids as they are made,
and ``generate_tokens`` / ``generate`` to collect them. The scheduler serves many requests
at once; this class is the simple path for scripts, tests and the CLI.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import torch

from ttft.engine.kv_cache import PagedKVCache
from ttft.engine.model import ModelConfig, Transformer, decode_step, prefill
from ttft.engine.sampler import SamplingParams, make_generator, sample
from ttft.engine.tokenizer import Tokenizer

__all__ = ["LLM"]

# Blocks beyond one max-length sequence, so a request that ends exactly on a block
# boundary, or a caller's own extra Seq, never hits CacheFull.
_SLACK_BLOCKS = 1


class LLM:
    """A model, its tokenizer and a K/V cache; build one with :meth:`from_preset`.

    Not thread-safe: every call runs on the caller's thread and uses the shared cache.
    Each request allocates its own blocks and frees them when it ends, normally or by an
    exception (for :meth:`stream`: when the generator is exhausted or closed).
    """

    def __init__(self, model: Transformer, tokenizer: Tokenizer, cache: PagedKVCache) -> None:
        if tokenizer.vocab_size > model.config.vocab_size:
            raise ValueError(
                f"tokenizer has {tokenizer.vocab_size} ids but the model only "
                f"{model.config.vocab_size}; load the tokenizer with the model's vocab_size"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.cache = cache

    @classmethod
    def from_preset(
        cls,
        name: str,
        seed: int = 0,
        device: str | torch.device = "auto",
        cache_dir: str | os.PathLike[str] | None = None,
        block_size: int = 16,
    ) -> LLM:
        """A random-weight model of preset ``name`` with a matching tokenizer and cache.

        Args:
            name: a :meth:`ModelConfig.preset` name (``tiny``, ``small``, ``base``).
            seed: seeds the weights (the same on every device).
            device: ``auto`` (CUDA when available), ``cpu``, ``cuda``, ...; float32 on CPU,
                bfloat16 on CUDA.
            cache_dir: where the tokenizer JSON is cached; default
                :func:`ttft.engine.tokenizer.default_cache_dir`.
            block_size: positions per K/V cache block. The cache holds one
                ``max_seq_len`` sequence plus one block of slack.

        Raises:
            ValueError: unknown preset name.
        """
        config = ModelConfig.preset(name)
        model = Transformer.from_config(config, seed=seed, device=device)
        tokenizer = Tokenizer.load(vocab_size=config.vocab_size, cache_dir=cache_dir)
        num_blocks = -(-config.max_seq_len // block_size) + _SLACK_BLOCKS
        cache = PagedKVCache.for_model(model, num_blocks=num_blocks, block_size=block_size)
        return cls(model, tokenizer, cache)

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.device

    # -- forward ------------------------------------------------------------------------

    def prefill(self, token_ids: Sequence[int], chunk_size: int | None = None) -> torch.Tensor:
        """Logits after the prompt ``token_ids``, computed in chunks of ``chunk_size``.

        Chunking changes only the work split, not the result (up to float rounding: within
        1e-5 in float32). The K/V written on the way is freed before returning.

        Args:
            token_ids: 1 to ``max_seq_len`` ids in ``0 .. vocab_size - 1``.
            chunk_size: prompt tokens per forward pass; None runs the whole prompt at once.

        Returns:
            ``(vocab_size,)`` float32 logits of the last prompt position, on the model's
            device.

        Raises:
            ValueError: empty or too long prompt, an id out of range, or ``chunk_size < 1``.
        """
        ids = self._check_prompt(token_ids, max_tokens=0, chunk_size=chunk_size)
        return prefill(self.model, self.cache, ids, chunk_size)

    # -- generation ---------------------------------------------------------------------

    def stream(
        self,
        token_ids: Sequence[int],
        max_tokens: int,
        temperature: float = 0.0,
        chunk_size: int | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> Iterator[int]:
        """Yield up to ``max_tokens`` new token ids continuing ``token_ids``, one at a time.

        The prompt is prefilled (in chunks of ``chunk_size`` when given), then each token
        is sampled with :func:`ttft.engine.sampler.sample` and fed back through
        :func:`ttft.engine.model.decode_step`. Generation stops after ``max_tokens`` ids
        or at the tokenizer's EOS, which is not yielded.

        Arguments are checked when ``stream`` is called; the model runs only as the
        iterator is consumed. The request's cache blocks are freed when the iterator is
        exhausted, closed (``close()``, or ``break`` followed by garbage collection) or
        raises.

        Args:
            token_ids: the prompt, 1 to ``max_seq_len`` ids; no BOS is added.
            max_tokens: most ids to yield, ``>= 0``.
            temperature: 0 is greedy (argmax); otherwise softmax temperature.
            chunk_size: prompt tokens per prefill forward pass; None is the whole prompt.
            top_p: nucleus mass in ``(0, 1]``.
            seed: seeds this request's sampler; None draws a fresh seed. The same seed and
                arguments give the same ids.

        Raises:
            ValueError: bad sampling parameters, an empty prompt, an id out of range, or
                ``len(token_ids) + max_tokens - 1 > max_seq_len`` (the last id is sampled,
                never run through the model).
        """
        params = SamplingParams(temperature=temperature, top_p=top_p, seed=seed)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
        ids = self._check_prompt(token_ids, max_tokens, chunk_size)
        return self._stream(ids, max_tokens, params, chunk_size)

    def _stream(
        self, ids: list[int], max_tokens: int, params: SamplingParams, chunk_size: int | None
    ) -> Iterator[int]:
        if max_tokens == 0:
            return
        eos = self.tokenizer.eos_id
        seq = self.cache.allocate()
        try:
            logits = prefill(self.model, self.cache, ids, chunk_size, seq=seq)  # (V,)
            gen = None if params.greedy else make_generator(params, logits.device)
            for i in range(max_tokens):
                token = sample(logits, params, gen)
                if token == eos:
                    return
                yield token
                if i + 1 < max_tokens:
                    logits = decode_step(self.model, self.cache, [seq], [token])[0]
        finally:
            self.cache.free(seq)

    def generate_tokens(
        self,
        token_ids: Sequence[int],
        max_tokens: int,
        temperature: float = 0.0,
        chunk_size: int | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """All ids :meth:`stream` yields for these arguments (EOS excluded), as a list."""
        return list(self.stream(token_ids, max_tokens, temperature, chunk_size, top_p, seed))

    def generate(
        self,
        prompt: str,
        max_tokens: int,
        temperature: float = 0.0,
        chunk_size: int | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> str:
        """Continue the text ``prompt`` by up to ``max_tokens`` tokens; return only the new text.

        The prompt is encoded with BOS prepended (so an empty prompt is valid), then
        continued as :meth:`stream` does; the new ids, without EOS, are decoded.

        Raises:
            ValueError: as :meth:`stream`, counting BOS as a prompt token.
        """
        ids = [self.tokenizer.bos_id, *self.tokenizer.encode(prompt)]
        new_ids = self.generate_tokens(ids, max_tokens, temperature, chunk_size, top_p, seed)
        return self.tokenizer.decode(new_ids)

    # -- checks -------------------------------------------------------------------------

    def _check_prompt(
        self, token_ids: Sequence[int], max_tokens: int, chunk_size: int | None
    ) -> list[int]:
        ids = [int(t) for t in token_ids]
        max_len, vocab = self.config.max_seq_len, self.config.vocab_size
        if not ids:
            raise ValueError("empty prompt: need at least one token id")
        if len(ids) > max_len:
            raise ValueError(
                f"prompt of {len(ids)} tokens is longer than max_seq_len {max_len}; "
                f"shorten it to at most {max_len} tokens"
            )
        if len(ids) + max_tokens - 1 > max_len:
            raise ValueError(
                f"prompt of {len(ids)} tokens plus max_tokens {max_tokens} needs "
                f"{len(ids) + max_tokens - 1} positions, more than max_seq_len {max_len}; "
                f"lower max_tokens to at most {max_len - len(ids) + 1}"
            )
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids out of range 0..{vocab - 1}: {bad[:8]}")
        if chunk_size is not None and (
            isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
        ):
            raise ValueError(f"chunk_size must be None or an int >= 1, got {chunk_size!r}")
        return ids

    def __repr__(self) -> str:
        c = self.config
        return (
            f"LLM(n_layer={c.n_layer}, d_model={c.d_model}, vocab_size={c.vocab_size}, "
            f"max_seq_len={c.max_seq_len}, device={self.device}, "
            f"cache_blocks={self.cache.num_blocks}x{self.cache.block_size})"
        )
