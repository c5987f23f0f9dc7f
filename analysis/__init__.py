"""ttft.analysis: pure functions over span tables (no I/O, no printing).

:func:`analyze` is the one way through: it assembles a span table (from
:func:`ttft.collectors.read_spans`) into requests, attributes every TTFT to stages and
summarizes it, returning an :class:`Analysis`: it is ``merge([analyze_part(table)])``, and a
dataset's partitions are analysed by the same two functions, one :class:`Part` each. Blame,
prefill scaling and the roofline regime are per-request rows of each part, so "a request"
means the same in all of them.
"""

from typing import TYPE_CHECKING

from ttft.tracer.lazy import lazy_exports

if TYPE_CHECKING:
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

_EXPORTS = {
    "Analysis": "ttft.analysis.pipeline",
    "Assembly": "ttft.analysis.assemble",
    "Attribution": "ttft.analysis.attribution",
    "ClockOffset": "ttft.analysis.clock_offset",
    "ModelShape": "ttft.analysis.regime",
    "Part": "ttft.analysis.part",
    "Peaks": "ttft.analysis.regime",
    "QuadraticFit": "ttft.analysis.prefill",
    "Quality": "ttft.analysis.quality",
    "RegimeResult": "ttft.analysis.regime",
    "RequestValues": "ttft.analysis.request_values",
    "Rows": "ttft.analysis.assemble",
    "Summary": "ttft.analysis.summary",
    "analyze": "ttft.analysis.pipeline",
    "analyze_part": "ttft.analysis.part",
    "apply_offsets": "ttft.analysis.clocks",
    "assemble": "ttft.analysis.assemble",
    "attribute": "ttft.analysis.attribution",
    "blame": "ttft.analysis.blame",
    "blame_summary": "ttft.analysis.blame",
    "chunk_cost": "ttft.analysis.regime",
    "compare": "ttft.analysis.compare",
    "compute_regime": "ttft.analysis.regime",
    "estimate_offsets": "ttft.analysis.clocks",
    "find_model_and_device": "ttft.analysis.regime",
    "find_peaks": "ttft.analysis.regime",
    "fit_quadratic": "ttft.analysis.prefill",
    "merge": "ttft.analysis.part",
    "percentile_bands": "ttft.analysis.summary",
    "prefill_fits": "ttft.analysis.prefill",
    "prefill_points": "ttft.analysis.prefill",
    "regime": "ttft.analysis.regime",
    "regime_summary": "ttft.analysis.regime",
    "regressions": "ttft.analysis.compare",
    "stage_table": "ttft.analysis.summary",
    "summarize": "ttft.analysis.summary",
}

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
