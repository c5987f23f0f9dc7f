"""Fixtures of the engine's tests: the tiny model's deterministic weights and the shipped
tokenizer, once per module (a module may define its own of either name instead)."""

from __future__ import annotations

import pytest

from ttft.engine.model import ModelConfig, Transformer
from ttft.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer.from_config(ModelConfig.preset("tiny"), seed=0)


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.load(cache_dir=tmp_path_factory.mktemp("tokenizer"))
