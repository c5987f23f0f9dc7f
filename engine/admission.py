"""What a request passes before it enters the engine's waiting queue: its prompt turned
into token ids without holding the event loop (``prompt_ids``), and the checks that it can
ever fit (``check_fits``; ``too_long``, the error for one too long for the model).

A text prompt is refused before tokenization when even its fewest possible tokens
(``ceil(utf8_bytes / Tokenizer.max_token_bytes)``) cannot fit the model, so a hostile
multi-megabyte prompt costs one UTF-8 encode; one that may fit is tokenized inline when
short and in a worker thread (``asyncio.to_thread``; the tokenizer releases the GIL) when
longer than ``INLINE_TOKENIZE_BYTES``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ttft.engine.tokenizer import Tokenizer

if TYPE_CHECKING:  # the checks need no torch
    from ttft.engine.kv_cache import PagedKVCache
    from ttft.engine.model import ModelConfig

__all__ = ["INLINE_TOKENIZE_BYTES", "check_fits", "prompt_ids", "too_long"]

INLINE_TOKENIZE_BYTES = 16 << 10
"""Prompts up to this many UTF-8 bytes are tokenized on the caller's thread: a thread hop
costs more than their tokenization (well under a millisecond)."""


def too_long(prompt_tokens: str, max_tokens: int, max_seq_len: int) -> ValueError:
    """The error for a prompt of ``prompt_tokens`` (a count, or "at least N") that cannot
    fit ``max_seq_len`` with ``max_tokens``."""
    return ValueError(
        f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the model's "
        f"max_seq_len {max_seq_len}"
    )


async def prompt_ids(
    tokenizer: Tokenizer, prompt: str | list[int], max_tokens: int, max_seq_len: int
) -> list[int]:
    """The token ids of ``prompt`` (text, or ids used as they are), never holding the
    event loop for a long text.

    Raises:
        ValueError: the text is not valid Unicode (a lone surrogate), or is so long that it
            cannot fit ``max_seq_len`` with ``max_tokens`` (the message says "at least").
    """
    if not isinstance(prompt, str):
        return list(prompt)
    try:
        n_bytes = len(prompt.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise ValueError(f"prompt is not valid Unicode: {e.reason} at index {e.start}") from None
    fewest = -(-n_bytes // tokenizer.max_token_bytes)
    if fewest + max_tokens > max_seq_len:
        raise too_long(f"at least {fewest}", max_tokens, max_seq_len)
    if n_bytes <= INLINE_TOKENIZE_BYTES:
        return tokenizer.encode(prompt)
    return await asyncio.to_thread(tokenizer.encode, prompt)


def check_fits(ids: list[int], max_tokens: int, model: ModelConfig, cache: PagedKVCache) -> None:
    """Refuse prompt ``ids`` that the model or the whole K/V ``cache`` can never serve with
    ``max_tokens``.

    Raises:
        ValueError: an empty prompt, an id outside the vocabulary, more positions than
            ``max_seq_len`` or than the cache's blocks hold.
    """
    if not ids:
        raise ValueError("empty prompt")
    if any(not 0 <= i < model.vocab_size for i in ids):
        raise ValueError(f"prompt token ids must be in 0..{model.vocab_size - 1}")
    total = len(ids) + max_tokens
    if total > model.max_seq_len:
        raise too_long(str(len(ids)), max_tokens, model.max_seq_len)
    if -(-total // cache.block_size) > cache.num_blocks:
        raise ValueError(f"{total} positions never fit {cache.num_blocks} K/V blocks")
