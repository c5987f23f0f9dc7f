"""The timings the reference server reports in its responses when asked (``ttft serve
--report-timings``, off by default), in the shapes other servers use, so a client that
receives no spans can still place queue and prefill (``ttft.collectors.server_timings``).

- A streamed answer's final chunk (the one with the finish reason) and a whole answer's
  body carry a llama.cpp-style ``timings`` object (llama.cpp's server,
  ``tools/server/README.md``): ``prompt_n``, ``cache_n``, ``prompt_ms``, ``predicted_n``,
  ``predicted_ms``, plus ``queue_ms``, which llama.cpp does not send.
- A whole answer also has a ``Server-Timing`` header (W3C Server Timing, the metric names
  of TensorRT-LLM's ``trtllm-serve``): ``server_queue``, ``server_ttft``, ``server_e2e``,
  ``dur`` in ms. A streamed answer cannot: its headers go out before any of it is known.

What each figure measures here (``clock_ns()`` times of one request):

- ``queue_ms`` / ``server_queue``: entering the engine's waiting queue to its admission
  (the ``queue`` span);
- ``prompt_ms``: its admission to the first token's text (``schedule``, ``batch_wait``,
  ``prefill``, ``sample``, ``deliver`` to the event loop and ``detokenize``): what the
  prompt cost this request, as llama.cpp's ``prompt_ms`` is its prompt processing;
- ``predicted_ms``: the first token's text to the last's; ``predicted_n``: tokens made;
- ``server_ttft``: the endpoint's receipt of the request to the first token's text;
  ``server_e2e``: receipt to the response built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Timings"]

_NS_PER_MS = 1e6


@dataclass(frozen=True)
class Timings:
    """One ended generation's times (``clock_ns()``) and token counts."""

    received_ns: int
    queue_ns: int
    admitted_ns: int
    first_ns: int
    last_ns: int
    end_ns: int
    prompt_n: int
    cache_n: int
    predicted_n: int

    def llama(self) -> dict[str, Any]:
        """The llama.cpp-style ``timings`` object (and ``queue_ms``)."""
        return {
            "prompt_n": self.prompt_n,
            "cache_n": self.cache_n,
            "prompt_ms": _ms(self.first_ns - self.admitted_ns),
            "predicted_n": self.predicted_n,
            "predicted_ms": _ms(self.last_ns - self.first_ns),
            "queue_ms": _ms(self.queue_ns),
        }

    def server_timing(self) -> str:
        """The ``Server-Timing`` header's value."""
        metrics = (("server_queue", self.queue_ns),
                   ("server_ttft", self.first_ns - self.received_ns),
                   ("server_e2e", self.end_ns - self.received_ns))
        return ", ".join(f"{name};dur={_ms(ns)}" for name, ns in metrics)


def _ms(ns: int) -> float:
    return round(max(0, ns) / _NS_PER_MS, 3)
