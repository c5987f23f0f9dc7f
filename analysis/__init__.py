"""ttft.analysis: pure functions over span tables (no I/O, no printing).

:func:`analyze` is the one way through: it assembles a span table (from
:func:`ttft.collectors.read_spans`) into requests, attributes every TTFT to stages and
summarizes it, returning an :class:`Analysis`: it is ``merge([analyze_part(table)])``, and a
dataset's partitions are analysed by the same two functions, one :class:`Part` each. Blame,
prefill scaling and the roofline regime are per-request rows of each part, so "a request"
means the same in all of them.
"""

from ttft.analysis.assemble import Assembly, Rows, assemble
from ttft.analysis.attribution import Attribution, attribute
from ttft.analysis.blame import blame, blame_summary
from ttft.analysis.clock_offset import ClockOffset
from ttft.analysis.clocks import apply_offsets, estimate_offsets
from ttft.analysis.compare import compare, regressions
from ttft.analysis.part import Part, analyze_part, merge
from ttft.analysis.pipeline import Analysis, analyze
from ttft.analysis.prefill import QuadraticFit, fit_quadratic, prefill_fits, prefill_points
from ttft.analysis.quality import Quality
from ttft.analysis.regime import (
    ModelShape,
    Peaks,
    RegimeResult,
    chunk_cost,
    compute_regime,
    find_model_and_device,
    find_peaks,
    regime,
    regime_summary,
)
from ttft.analysis.request_values import RequestValues
from ttft.analysis.summary import Summary, percentile_bands, stage_table, summarize

__all__ = [
    "Analysis",
    "Assembly",
    "Attribution",
    "ClockOffset",
    "ModelShape",
    "Part",
    "Peaks",
    "QuadraticFit",
    "Quality",
    "RegimeResult",
    "RequestValues",
    "Rows",
    "Summary",
    "analyze",
    "analyze_part",
    "apply_offsets",
    "assemble",
    "attribute",
    "blame",
    "blame_summary",
    "chunk_cost",
    "compare",
    "compute_regime",
    "estimate_offsets",
    "find_model_and_device",
    "find_peaks",
    "fit_quadratic",
    "merge",
    "percentile_bands",
    "prefill_fits",
    "prefill_points",
    "regime",
    "regime_summary",
    "regressions",
    "stage_table",
    "summarize",
]
