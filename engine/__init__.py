"""ttft.engine: the reference engine ttft traces.

So far: the model (``ttft.engine.model``: presets, ``attend``, ``prefill_chunk``,
``decode_step``) and the paged K/V cache (``ttft.engine.kv_cache``). The tokenizer,
prefix cache, sampler, scheduler and server come next.
"""

from ttft.engine.kv_cache import BlockAllocator, CacheFull, PagedKVCache, Seq
from ttft.engine.model import (
    ModelConfig,
    Transformer,
    attend,
    decode_step,
    greedy,
    prefill,
    prefill_chunk,
)

__all__ = [
    "BlockAllocator",
    "CacheFull",
    "ModelConfig",
    "PagedKVCache",
    "Seq",
    "Transformer",
    "attend",
    "decode_step",
    "greedy",
    "prefill",
    "prefill_chunk",
]
