"""The public API is a contract: each package's ``__all__`` is pinned here, sorted, and every
name in it resolves (lazily exported ones included), as httpx's
``tests/test_exported_members.py`` does.

Adding a package: one entry in ``EXPORTED``. Changing a package's exports: change its
``__all__`` and its entry here in the same commit.
"""

from __future__ import annotations

import importlib

import pytest

EXPORTED: dict[str, list[str]] = {
    "ttft.analysis": [
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
    ],
    "ttft.collectors": [
        "DATASET_FILE",
        "Event",
        "JoinReport",
        "Link",
        "OTLPGrpcReceiver",
        "OTLPReceiver",
        "ParquetSpanExporter",
        "StageMapping",
        "TraceFileError",
        "TraceLocation",
        "TraceRun",
        "TraceSpec",
        "TraceWriter",
        "dataset_info",
        "default_mapping",
        "event_span_id",
        "guess_format",
        "is_dataset",
        "join_traces",
        "load_mapping",
        "read_inputs",
        "read_partition",
        "read_spans",
        "run_metadata",
        "span_rows",
        "to_span_table",
        "trace_server",
        "write_dataset",
        "write_trace",
    ],
    "ttft.reports": [
        "ReportData",
        "build_report",
        "main",
        "render_analysis",
        "render_report",
        "write_html",
        "write_perfetto",
    ],
    "ttft.engine": [
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
    ],
    "ttft.tracer": [
        "FlushResult",
        "GpuResolver",
        "Instrumentation",
        "SCHEMA_VERSION",
        "SPAN_SCHEMA",
        "STAGE_NAMES",
        "SpanRef",
        "TTFTMiddleware",
        "Tracing",
        "add_link",
        "clock_ns",
        "configure",
        "current_span",
        "event",
        "format_traceparent",
        "instrument_module",
        "link_step",
        "new_request_root",
        "parse_traceparent",
        "record",
        "request_context",
        "request_parent",
        "stage",
        "stats",
    ],
}


@pytest.mark.parametrize("package", sorted(EXPORTED))
def test_exported_names_are_pinned(package):
    assert importlib.import_module(package).__all__ == EXPORTED[package]


@pytest.mark.parametrize("package", sorted(EXPORTED))
def test_every_exported_name_resolves(package):
    module = importlib.import_module(package)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []
    assert sorted(set(module.__all__)) == module.__all__  # sorted, no name twice
