"""What the decode side keeps of one request's K/V transfer while it is under way
(``Inbound``), and when a request's first token ends it (``finish_reason``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ttft.engine.stream import RequestState

__all__ = ["Inbound", "finish_reason"]


@dataclass(eq=False)
class Inbound:
    """One request's transfer as the decode side sees it (shared with the receiver)."""

    req: RequestState
    key: str
    total: int  # prompt blocks to receive
    parts: list[tuple[int, int, memoryview]] = field(default_factory=list)  # first, count, data
    blocks: list[int] | None = None  # the request's prompt blocks here, once admitted
    skip: int = 0  # of them, those its prefix-cache hit here holds already
    begin_ns: int = 0
    installed: int = 0
    installed_ns: int = 0
    nbytes: int = 0
    token: tuple[int, int, int, bytes] | None = None  # token, sampled_ns, cached, generator
    error: BaseException | None = None


def finish_reason(token: int, n_out: int, max_tokens: int, eos_id: int) -> str | None:
    """Why a request ends after its ``n_out``-th token ``token`` (None: it goes on)."""
    if token == eos_id:
        return "stop"
    return "length" if n_out >= max_tokens else None
