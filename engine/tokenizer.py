"""A byte-level BPE tokenizer trained on first use from a small corpus shipped in the package.

The tokenizer is a real ``tokenizers`` byte-level BPE (GPT-2 style pre-tokenization, every
byte in the initial alphabet), so ``decode(encode(s)) == s`` for every Python ``str`` that is
valid UTF-8. It is trained from ``ttft/engine/data/corpus.txt`` the first time a vocabulary
size is asked for and cached as JSON under ``$TTFT_CACHE_DIR`` (default ``~/.cache/ttft``);
nothing is downloaded. Training is deterministic: the same corpus and vocabulary size give
the same ids.

Corpus provenance (``data/corpus.txt``, about 63 KB of English prose, all public domain):
the United States Declaration of Independence (1776) and the Preamble to the Constitution
(1787); Lincoln's Gettysburg Address (1863); Genesis 1, Psalm 23 and Ecclesiastes 3:1-8
from the King James Version (1611); Shakespeare's Sonnets 18, 29, 73 and 116 (1609); a few
Aesop fables following *The Aesop for Children* (1919); and further fables, Grimm-style
tales and descriptive sketches written for this project and dedicated to the public domain
(CC0).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import logging
import os
import random
import tempfile
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

__all__ = ["BOS", "EOS", "Tokenizer", "corpus_text", "default_cache_dir"]

log = logging.getLogger(__name__)

BOS = "<|bos|>"
EOS = "<|eos|>"
_SPECIALS = (BOS, EOS)
# Bump when training settings change so old cache files are not reused.
_FORMAT = 1
# 256 byte tokens plus the two special tokens.
_MIN_VOCAB = 256 + len(_SPECIALS)
# A word that does not fit the remaining budget is skipped; after this many skips in a row
# prompt_of_length fills the rest with one-byte chunks (exactly one token each).
_MAX_SKIPS = 256
# Longer texts are tokenized on the batch path, which releases the GIL (``encode``).
_GIL_FREE_CHARS = 4096


def corpus_text() -> str:
    """The training corpus shipped with the package, as text."""
    resource = importlib.resources.files("ttft.engine") / "data" / "corpus.txt"
    return resource.read_text(encoding="utf-8")


def default_cache_dir() -> Path:
    """``$TTFT_CACHE_DIR`` when set, else ``~/.cache/ttft``."""
    env = os.environ.get("TTFT_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ttft"


def _train(text: str, vocab_size: int) -> tokenizers.Tokenizer:
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(text.splitlines(keepends=True), trainer)
    return backend


def _write_atomic(path: Path, data: str) -> None:
    """Write ``data`` to ``path`` so readers see the old file, the new file, or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Tokenizer:
    """Byte-level BPE over the shipped corpus; build one with :meth:`load`.

    ``encode`` adds no special tokens: callers that want a BOS prepend :attr:`bos_id`.
    A literal ``"<|bos|>"`` or ``"<|eos|>"`` in the text encodes to the special id (as in
    Hugging Face tokenizers), and decodes back to the same text. Instances are read-only
    and safe to share between threads.
    """

    def __init__(self, backend: tokenizers.Tokenizer) -> None:
        self._backend = backend
        self._words: list[str] | None = None
        self._word_cost: dict[str, int] = {}

    @classmethod
    def load(
        cls, vocab_size: int = 2048, cache_dir: str | os.PathLike[str] | None = None
    ) -> Tokenizer:
        """Load the cached tokenizer for ``vocab_size``, training and caching it if needed.

        The cache file name holds the vocabulary size and a hash of the corpus, so a changed
        corpus retrains. A missing, unreadable or corrupt cache file is retrained and
        rewritten atomically (concurrent first uses each train and the last rename wins; the
        results are identical). Failing to write the cache is logged, not raised.

        Args:
            vocab_size: total vocabulary including the 256 byte tokens and 2 special tokens.
            cache_dir: where the JSON lives; default :func:`default_cache_dir`.

        Raises:
            ValueError: ``vocab_size`` is below 258.
        """
        if vocab_size < _MIN_VOCAB:
            raise ValueError(f"vocab_size must be >= {_MIN_VOCAB}, got {vocab_size}")
        text = corpus_text()
        digest = hashlib.sha256(f"{_FORMAT}\0{text}".encode()).hexdigest()[:16]
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        path = root / f"bpe-bytelevel-v{vocab_size}-{digest}.json"
        if path.exists():
            try:
                backend = tokenizers.Tokenizer.from_file(str(path))
                if backend.get_vocab_size() == vocab_size and all(
                    backend.token_to_id(t) is not None for t in _SPECIALS
                ):
                    return cls(backend)
                log.warning("tokenizer cache %s does not match; retraining", path)
            except Exception as e:  # tokenizers raises a bare Exception on bad JSON
                log.warning("tokenizer cache %s is unreadable (%s); retraining", path, e)
        backend = _train(text, vocab_size)
        try:
            _write_atomic(path, backend.to_str())
        except OSError as e:
            log.warning("could not write tokenizer cache %s: %s", path, e)
        return cls(backend)

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included; ids are ``0 .. vocab_size - 1``."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most UTF-8 bytes of text one token covers, so a text of ``n`` bytes is at
        least ``ceil(n / max_token_bytes)`` tokens (a byte-level vocabulary spells each
        byte as one character; a special token matched in text covers its own length)."""
        return max(len(t) for t in self._backend.get_vocab(with_added_tokens=True))

    @property
    def bos_id(self) -> int:
        return self._special_id(BOS)

    @property
    def eos_id(self) -> int:
        return self._special_id(EOS)

    def _special_id(self, token: str) -> int:
        token_id = self._backend.token_to_id(token)
        assert token_id is not None, token
        return token_id

    def encode(self, text: str) -> list[int]:
        """Token ids for ``text``, without special tokens added.

        Threading: a text over ``_GIL_FREE_CHARS`` is tokenized with the GIL released
        (``tokenizers``' batch path; its single ``encode`` holds the GIL throughout), so
        calling this from a worker thread leaves other Python threads running, bar the
        final conversion of the ids to a list (about 70 ms a million ids).
        """
        if len(text) > _GIL_FREE_CHARS:
            return self._backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text for ``ids``; ``decode(encode(s)) == s`` for every valid UTF-8 string.

        A sequence that splits a multi-byte character decodes it as U+FFFD.

        Raises:
            ValueError: an id is outside ``0 .. vocab_size - 1``.
        """
        n = self.vocab_size
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"token ids out of range 0..{n - 1}: {bad[:8]}")
        return self._backend.decode(list(ids), skip_special_tokens=False)

    def count_tokens(self, text: str) -> int:
        """``len(encode(text))``."""
        return len(self._backend.encode(text, add_special_tokens=False).ids)

    def prompt_of_length(self, n: int, seed: int = 0) -> str:
        """English-looking text from the corpus whose ``encode`` is exactly ``n`` tokens.

        Words are taken in corpus order from a position chosen by ``seed`` (wrapping
        around), skipping any word that would overshoot; the result is checked by encoding.
        The same ``n`` and ``seed`` give the same text.

        Raises:
            ValueError: ``n`` is negative.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        words = self._corpus_words()
        pos = random.Random(seed).randrange(len(words))
        parts: list[str] = []
        total = skips = 0
        while total < n and skips < _MAX_SKIPS:
            word = words[pos % len(words)]
            pos += 1
            piece = f" {word}" if parts else word
            # Byte-level pre-tokenization splits at the space before each word, so the
            # count of the joined text is the sum of the pieces' counts.
            cost = self._word_cost.get(piece)
            if cost is None:
                cost = self._word_cost[piece] = self.count_tokens(piece)
            if total + cost <= n:
                parts.append(piece)
                total += cost
                skips = 0
            else:
                skips += 1
        text = "".join(parts) + _one_byte_chunks(parts[-1][-1] if parts else "", n - total)
        got = self.count_tokens(text)
        if got != n:  # not expected: would mean the additivity above is wrong
            raise RuntimeError(f"prompt_of_length({n}, seed={seed}) built {got} tokens")
        return text

    def ids_of_length(self, n: int, seed: int = 0) -> list[int]:
        """``encode(prompt_of_length(n, seed))``: exactly ``n`` ids, no special tokens."""
        return self.encode(self.prompt_of_length(n, seed))

    def _corpus_words(self) -> list[str]:
        if self._words is None:
            self._words = corpus_text().split()
        return self._words

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"


def _one_byte_chunks(prev: str, k: int) -> str:
    """``k`` ASCII characters that pre-tokenize into ``k`` one-byte chunks after ``prev``.

    Letters and punctuation alternate, so no two neighbours share a chunk; a one-byte chunk
    is always exactly one token.
    """
    letter = not prev.isalpha()
    out = []
    for _ in range(k):
        out.append("x" if letter else ".")
        letter = not letter
    return "".join(out)
