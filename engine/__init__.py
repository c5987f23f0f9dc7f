"""ttft.engine: the reference engine ttft traces.

The model (``ttft.engine.model``: presets, ``attend``, ``prefill_chunk``,
``decode_step``), the paged K/V cache (``ttft.engine.kv_cache``), the prefix cache
(``ttft.engine.prefix_cache``), sampling (``ttft.engine.sampler``), the byte-level BPE
tokenizer trained from a packaged corpus (``ttft.engine.tokenizer``) and ``LLM``, the
one-process convenience API (``LLM.from_preset("tiny").generate("Once upon", 16)``).

``Engine`` (``ttft.engine.engine``) is the traced continuous-batching engine: its
configuration (``ttft.engine.config``), the scheduling policy as a pure function
(``plan_step``, ``ttft.engine.policy``), the request stream (``ttft.engine.stream``), its
spans (``ttft.engine.spans``) and fault injection (``ttft.engine.faults``).
``ttft.engine.profile`` measures prefill alone. ``ttft.engine.server`` serves the engine
over an OpenAI-compatible HTTP API (``ttft serve``); it is not imported here, so the
engine works without FastAPI loaded.
"""

from ttft.engine.config import EngineConfig
from ttft.engine.engine import Engine, EngineStopped, QueueFull
from ttft.engine.kv_cache import BlockAllocator, CacheFull, PagedKVCache, Seq
from ttft.engine.llm import LLM
from ttft.engine.model import (
    ModelConfig,
    Transformer,
    attend,
    decode_step,
    greedy,
    prefill,
    prefill_chunk,
)
from ttft.engine.policy import plan_step
from ttft.engine.prefix_cache import PrefixCache
from ttft.engine.sampler import SamplingParams, make_generator, sample, sample_batch
from ttft.engine.stream import RequestStream, TokenEvent
from ttft.engine.tokenizer import Tokenizer

__all__ = [
    "BlockAllocator",
    "CacheFull",
    "Engine",
    "EngineConfig",
    "EngineStopped",
    "LLM",
    "ModelConfig",
    "PagedKVCache",
    "PrefixCache",
    "QueueFull",
    "RequestStream",
    "SamplingParams",
    "Seq",
    "TokenEvent",
    "Tokenizer",
    "Transformer",
    "attend",
    "decode_step",
    "greedy",
    "make_generator",
    "plan_step",
    "prefill",
    "prefill_chunk",
    "sample",
    "sample_batch",
]
