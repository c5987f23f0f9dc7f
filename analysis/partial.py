"""A dataset analysed partition by partition, merged into exactly the one-process answer.

Each partition of a dataset (``analysis.partition``) holds whole requests plus copies of
the engine step traces they joined, so assembling and attributing it alone gives its
requests exactly the parts one process gives them, provided every partition uses the same
clock offsets: those are estimated over all requests first, from each partition's
`part_bounds` (``clocks.offsets_from_bounds``). The default boundary is the outermost one
any request of any partition supports. `merge_parts` then concatenates the per-request
parts and summarizes them once: percentiles come from every request, never from per-
partition figures, and every mean is taken in a way that does not depend on the order of
the requests (``summary._mean_ms``, ``decode._ms``), so the merged summary equals the
single-process summary of the same spans bit for bit.

Pure functions (no I/O); the orchestration (Dask, reading partitions, writing per-request
parts) lives in ``ttft.reports.runs.distributed``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from ttft.analysis import clocks
from ttft.analysis._grouping import Decoded
from ttft.analysis.after_first_token import KEYS, after_first_token_values
from ttft.analysis.assemble import Assembly, assemble
from ttft.analysis.attribution import Attribution, attribute
from ttft.analysis.load import VALUE_KEYS, load_values
from ttft.analysis.quality import Quality
from ttft.analysis.summary import Summary, summarize
from ttft.analysis.transfer import transfers
from ttft.tracer.schema import BOUNDARY_NAMES, SCHEMA_VERSION

__all__ = ["Part", "analyze_part", "assemble_part", "default_boundary", "locate", "merge_parts",
           "part_bounds", "part_of"]


def _borrowed(table: pa.Table, own_rows: int) -> np.ndarray:
    mask = np.zeros(table.num_rows, bool)
    mask[own_rows:] = True
    return mask


def part_bounds(table: pa.Table, d: Decoded | None = None) -> clocks.Bounds:
    """The clock `~ttft.analysis.clocks.Bounds` of one partition's requests (its borrowed
    step traces hold no request, so they add none); ``d`` is the table decoded, if it was."""
    return clocks.table_bounds(table, d)


@dataclass
class Part:
    """One partition analysed: its attribution (``request`` indices local to it), the
    `after_first_token_values` of its ok requests, the boundaries any of its requests support, the
    ``analysis.load.load_values`` of its requests and the ``analysis.transfer.transfers``
    of its ok requests."""

    attribution: Attribution
    decode: dict[str, np.ndarray]
    boundaries: tuple[str, ...]
    load: dict[str, np.ndarray]
    transfers: pd.DataFrame


def assemble_part(table: pa.Table, own_rows: int, offsets: Sequence[clocks.ClockOffset]
                  ) -> Assembly:
    """One partition assembled: ``table`` holds its own rows first, then ``own_rows``
    onwards the copies it borrowed (their defects are counted where they are owned);
    ``offsets`` are the dataset's."""
    return assemble(table, offsets=offsets, borrowed=_borrowed(table, own_rows))


def part_of(asm: Assembly, boundary: str | None, policy: str) -> Part:
    """The `Part` of an assembled partition (`assemble_part`) at ``boundary`` (None: its
    own outermost one) and ``policy``.

    Raises:
        ValueError: an unknown boundary or policy.
    """
    supported = tuple(name for name in BOUNDARY_NAMES if asm.has_window(name).any())
    attr = attribute(asm, boundary, policy)
    ok = attr.requests["request"].to_numpy()
    values = after_first_token_values(asm, ok)
    return Part(attr, values, supported, load_values(asm, attr, values), transfers(asm, ok))


def analyze_part(table: pa.Table, own_rows: int, offsets: Sequence[clocks.ClockOffset],
                 boundary: str | None, policy: str) -> Part:
    """Assemble and attribute one partition (`assemble_part`, then `part_of`).

    With ``boundary`` None the partition is attributed at its own outermost boundary; the
    caller re-runs it at the dataset's (`default_boundary`) when that differs.

    Raises:
        ValueError: an unknown boundary or policy.
    """
    return part_of(assemble_part(table, own_rows, offsets), boundary, policy)


def default_boundary(parts: Sequence[Part]) -> str:
    """The outermost boundary at least one request of any part supports (else ``engine``),
    as ``Assembly.default_boundary`` chooses for the whole."""
    supported = {name for part in parts for name in part.boundaries}
    return next((name for name in BOUNDARY_NAMES if name in supported), BOUNDARY_NAMES[-1])


def _stacked(frames: list[pd.DataFrame], counts: list[int] | None = None) -> pd.DataFrame:
    """Concatenated frames; with ``counts`` (requests of each part), each part's
    ``request`` column moved past the parts before it."""
    if counts is not None:
        firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        frames = [f.assign(request=f["request"].to_numpy(np.int64) + first)
                  for f, first in zip(frames, firsts, strict=True)]
    kept = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(kept, ignore_index=True)


def merge_parts(parts: Sequence[Part], offsets: Sequence[clocks.ClockOffset], *,
                trace: str = "", schema_version: int = SCHEMA_VERSION,
                slo: Mapping[str, float] | None = None) -> tuple[Attribution, Summary]:
    """The dataset's attribution and summary from its parts, all at one boundary.

    Args:
        parts: every partition's `Part`, in partition order.
        offsets: the clock offsets the parts were assembled with.
        trace: the dataset's path, echoed in the summary.
        schema_version: the dataset's schema version.
        slo: SLO limits in ms per metric for the summary's goodput (``summarize``).

    Raises:
        ValueError: no parts, parts attributed at different boundaries or policies, or an
            unknown SLO metric.
    """
    if not parts:
        raise ValueError("no partitions to merge")
    attrs = [part.attribution for part in parts]
    if len({(a.boundary, a.policy) for a in attrs}) != 1:
        raise ValueError("partitions were attributed at different boundaries or policies")
    quality = Quality()  # partition 0 alone carries the importer's rejected spans
    for attr in attrs:
        quality = quality.merged(attr.quality)
    quality.clocks = list(offsets)
    counts = [_requests_of(attr) for attr in attrs]
    merged = Attribution(
        attrs[0].boundary, attrs[0].policy,
        _stacked([a.requests for a in attrs], counts),
        _stacked([a.attributed for a in attrs]),
        _stacked([a.covered for a in attrs]),
        _stacked([a.raw for a in attrs]),
        quality,
        _stacked([a.failed for a in attrs], counts),
    )
    values = {key: np.concatenate([part.decode[key] for part in parts]) for key in KEYS}
    loads = {key: np.concatenate([part.load[key] for part in parts]) for key in VALUE_KEYS}
    summary = summarize(merged, None, trace=trace, schema_version=schema_version,
                        decode=values, loads=loads, slo=slo,
                        kv=_stacked([part.transfers for part in parts]))
    return merged, summary


def _requests_of(attr: Attribution) -> int:
    """The number of requests of the partition's assembly (every request is in ``requests``
    or ``failed``, or was left out as ``no_window``)."""
    return len(attr.requests) + len(attr.failed) + attr.quality.counts["no_window"]



def locate(parts: Sequence[Part], request: int) -> tuple[int, int]:
    """``(partition, its own request index)`` of request ``request`` of `merge_parts`'s
    attribution (the ``request`` column of its frames)."""
    firsts = np.cumsum([_requests_of(part.attribution) for part in parts])
    k = int(np.searchsorted(firsts, request, side="right"))
    return k, request - (int(firsts[k - 1]) if k else 0)
