"""Byte-level BPE tokenizer: on-disk cache (reuse, corrupt file), exact round trips,
vocabulary size, prompts of an exact token count, and deterministic training."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ttft.engine.tokenizer import BOS, EOS, Tokenizer, default_cache_dir


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tokenizer-cache")


@pytest.fixture(scope="module")
def tok(cache_dir: Path) -> Tokenizer:
    return Tokenizer.load(vocab_size=2048, cache_dir=cache_dir)


def cache_files(d: Path) -> list[Path]:
    return sorted(d.glob("*.json"))


def test_training_writes_cache_and_second_load_reuses_it(tok: Tokenizer, cache_dir: Path):
    [path] = cache_files(cache_dir)
    assert "2048" in path.name
    before = path.stat()
    again = Tokenizer.load(vocab_size=2048, cache_dir=cache_dir)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert cache_files(cache_dir) == [path]  # no stray temp files
    text = "The Fox and the Grapes, again."
    assert again.encode(text) == tok.encode(text)


def test_corrupt_cache_is_retrained(tok: Tokenizer, tmp_path: Path, caplog):
    Tokenizer.load(vocab_size=2048, cache_dir=tmp_path)
    [path] = cache_files(tmp_path)
    path.write_text('{"version": "1.0", "model": ', encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="ttft.engine.tokenizer"):
        fixed = Tokenizer.load(vocab_size=2048, cache_dir=tmp_path)
    assert "retraining" in caplog.text
    assert fixed.encode("Four score and seven") == tok.encode("Four score and seven")
    assert Tokenizer.load(vocab_size=2048, cache_dir=tmp_path).vocab_size == 2048


def test_default_cache_dir_honours_env(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("TTFT_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("TTFT_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "ttft"


TRICKY = [
    "",
    " ",
    "  leading spaces",
    "trailing spaces   ",
    "\n",
    "\n\n\nthree newlines\r\nand CRLF\r\n",
    "\ttabs\tand\x00NUL\x7f",
    "emoji 🙂👍🏽 and a family 👨‍👩‍👧",
    "CJK 世界 日本語 한국어",
    "accents: café naïve Ångström",
    "combining e\u0301 and zero\u200bwidth",
    "RTL: مرحبا שלום",
    f"{BOS}special tokens inline{EOS}",
    "<|bos",
    "code: def f(x):\n    return x ** 2  # ok",
    "numbers 1234567890 3.14159 -0.0 1e-9",
    "\U0010ffff\ue000",
]


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip_tricky_strings(tok: Tokenizer, text: str):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.count_tokens(text) == len(ids)


@given(st.text())
def test_round_trip_any_text(tok: Tokenizer, text: str):
    assert tok.decode(tok.encode(text)) == text


def test_special_ids_and_vocab_size(tok: Tokenizer):
    assert tok.vocab_size == 2048
    assert {tok.bos_id, tok.eos_id} == {0, 1}
    assert tok.encode(BOS) == [tok.bos_id]
    assert tok.decode([tok.bos_id, *tok.encode("hi"), tok.eos_id]) == f"{BOS}hi{EOS}"
    assert max(tok.encode("The unanimous Declaration of the thirteen united States")) < 2048
    # Trained merges compress the corpus's own prose well below one token per byte.
    prose = "We hold these truths to be self-evident"
    assert tok.count_tokens(prose) < len(prose) / 2


def test_other_vocab_size_and_bounds(tmp_path: Path):
    small = Tokenizer.load(vocab_size=512, cache_dir=tmp_path)
    assert small.vocab_size == 512
    assert "512" in cache_files(tmp_path)[0].name
    with pytest.raises(ValueError, match="vocab_size"):
        Tokenizer.load(vocab_size=100, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="out of range"):
        small.decode([512])


@pytest.mark.parametrize("n", [0, 1, 2, 17, 100, 513])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_prompt_of_length_is_exact(tok: Tokenizer, n: int, seed: int):
    text = tok.prompt_of_length(n, seed=seed)
    assert len(tok.encode(text)) == n
    assert tok.prompt_of_length(n, seed=seed) == text
    ids = tok.ids_of_length(n, seed=seed)
    assert ids == tok.encode(text)
    assert len(ids) == n


def test_prompt_of_length_long_and_english(tok: Tokenizer):
    text = tok.prompt_of_length(20_000, seed=3)  # longer than the corpus: wraps around
    assert tok.count_tokens(text) == 20_000
    assert text.isascii()
    assert tok.prompt_of_length(50, seed=1) != tok.prompt_of_length(50, seed=2)


def test_prompt_of_length_rejects_negative(tok: Tokenizer):
    with pytest.raises(ValueError, match="n must be >= 0"):
        tok.prompt_of_length(-1)
    with pytest.raises(ValueError):
        tok.ids_of_length(-5)


def test_training_is_deterministic(tok: Tokenizer, cache_dir: Path, tmp_path: Path):
    a = Tokenizer.load(vocab_size=2048, cache_dir=tmp_path / "a")
    b = Tokenizer.load(vocab_size=2048, cache_dir=tmp_path / "b")
    [fa], [fb], [f0] = (
        cache_files(tmp_path / "a"),
        cache_files(tmp_path / "b"),
        cache_files(cache_dir),
    )
    assert fa.read_bytes() == fb.read_bytes() == f0.read_bytes()
    text = "Once upon a time, in a valley between two dark hills, there lived a miller."
    assert a.encode(text) == b.encode(text) == tok.encode(text)
