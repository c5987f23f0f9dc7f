"""Token sampling, kept apart from the forward pass: greedy, temperature and nucleus (top-p).

Each request carries its own ``torch.Generator`` (``make_generator``) so a seeded request
draws the same tokens whatever else runs in the same batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "MIN_TEMPERATURE",
    "MIN_TOP_P",
    "SamplingError",
    "SamplingParams",
    "make_generator",
    "sample",
    "sample_batch",
]

MIN_TEMPERATURE = 1e-6
"""The smallest non-zero temperature (as vLLM's sampling epsilon): below it the
distribution is greedy to within float32, and ``logits / temperature`` overflows."""
MIN_TOP_P = 1e-6
"""The smallest ``top_p``: below it the mass underflows float32 (the top token alone)."""


class SamplingError(ValueError):
    """One row's logits give no distribution to draw from (non-finite or zero mass); only
    the request of that row fails."""


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its next token.

    Attributes:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it, which
            must then be at least ``MIN_TEMPERATURE``.
        top_p: nucleus mass in ``[MIN_TOP_P, 1]``; 1 keeps the whole vocabulary.
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
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, "
                f"got {self.temperature!r}"
            )
        if not (isinstance(self.top_p, (int, float)) and MIN_TOP_P <= self.top_p <= 1):
            raise ValueError(f"top_p must be in [{MIN_TOP_P:g}, 1], got {self.top_p!r}")
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

    Raises:
        SamplingError: the logits hold NaN or infinities, or ``temperature`` (bypassing
            the checks of ``SamplingParams``) turns them into no distribution.
    """
    if logits.dim() != 1:
        raise ValueError(f"expected one row of logits (V,), got shape {tuple(logits.shape)}")
    if not bool(torch.isfinite(logits).all()):
        raise SamplingError("the logits are not finite: no distribution to sample from")
    if params.greedy:
        return int(logits.argmax())
    # Shifted so the largest is 0: the top token keeps probability > 0 however small the
    # temperature (the others underflow to 0 rather than the sum to 0/0).
    shifted = logits.float() - logits.float().max()
    probs = torch.softmax(shifted / params.temperature, dim=-1)
    if not bool(torch.isfinite(probs).all()):
        raise SamplingError(
            f"temperature {params.temperature!r} gives no distribution over these logits"
        )
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
