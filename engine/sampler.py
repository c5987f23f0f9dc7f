"""Token sampling, kept apart from the forward pass: greedy, temperature and nucleus (top-p).

Each request carries its own ``torch.Generator`` (``make_generator``) so a seeded request
draws the same tokens whatever else runs in the same batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its next token.

    Attributes:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it.
        top_p: nucleus mass in ``(0, 1]``; 1 keeps the whole vocabulary.
        seed: seeds the request's generator; None draws a fresh, unpredictable seed.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        bad_seed = isinstance(self.seed, bool) or not isinstance(self.seed, (int, type(None)))
        if bad_seed:
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(params: SamplingParams, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator for one request on ``device`` (where its logits live), seeded from
    ``params.seed``, or non-deterministically when the seed is None."""
    gen = torch.Generator(device=device)
    if params.seed is None:
        gen.seed()
    else:
        gen.manual_seed(params.seed)
    return gen


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> int:
    """Pick one token id from one row of logits.

    Args:
        logits: ``(V,)`` logits (computed in float32 whatever their dtype).
        params: greedy when ``temperature == 0``; otherwise
            ``softmax(logits / temperature)`` restricted to the smallest set of most likely
            tokens whose mass is ``>= top_p`` (always at least the most likely one).
        generator: on ``logits``' device; None uses torch's global generator. Unused
            when greedy.

    Returns:
        The token id. Ties in greedy mode go to the lowest id (``argmax``).
    """
    if logits.dim() != 1:
        raise ValueError(f"expected one row of logits (V,), got shape {tuple(logits.shape)}")
    if params.greedy:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p >= 1:
        return int(torch.multinomial(probs, 1, generator=generator))
    # Stable so that among equal probabilities the lowest id ranks first, as argmax does.
    sorted_probs, order = torch.sort(probs, descending=True, stable=True)  # (V,), (V,)
    mass_before = sorted_probs.cumsum(0) - sorted_probs
    # Token k is kept while the mass of the tokens ranked above it is still short of top_p;
    # the top token has mass_before 0 < top_p, so it is always kept.
    kept = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
    choice = int(torch.multinomial(kept, 1, generator=generator))
    return int(order[choice])


def sample_batch(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """``sample`` for each row of ``(B, V)`` logits, row ``b`` with ``params[b]`` and
    ``generators[b]``."""
    if logits.dim() != 2:
        raise ValueError(f"expected (B, V) logits, got shape {tuple(logits.shape)}")
    if not len(params) == len(generators) == logits.size(0):
        raise ValueError(
            f"{logits.size(0)} rows of logits, {len(params)} SamplingParams and "
            f"{len(generators)} generators; need one of each per row"
        )
    return [sample(row, p, g) for row, p, g in zip(logits, params, generators, strict=True)]
