"""ttft.collectors: where spans come from and where they go.

Reading: :func:`read_spans` reads a trace in any format (ttft Parquet, OTLP, Jaeger,
Chrome/PyTorch profiler) with serving stacks' span names mapped onto stages
(:class:`StageMapping`); it is the one way any command or library function reads a trace,
and :class:`TraceFileError` the one error for input that cannot be read. Writing:
:class:`TraceWriter` (crash-safe part files), :func:`write_trace`, and
:class:`ParquetSpanExporter` for any OpenTelemetry SDK pipeline. Partitioned datasets
(each partition's requests whole, for one task each): :func:`write_dataset`,
:func:`read_partition`, :func:`dataset_info`; :func:`read_spans` reads one whole.
Every producer of span rows builds them with :func:`span_rows`. Receiving:
:class:`OTLPReceiver` (HTTP) and :class:`OTLPGrpcReceiver`. Tracing a live server:
:func:`trace_server` with a :class:`TraceSpec`; joining files written elsewhere:
:func:`join_traces`.

Names are imported on first use (PEP 562), so ``import ttft.collectors`` pulls neither the
OpenTelemetry SDK nor gRPC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ttft.tracer.lazy import lazy_exports

if TYPE_CHECKING:
    from ttft.collectors._spans import to_span_table
    from ttft.collectors.dataset import (
        DATASET_FILE,
        dataset_info,
        is_dataset,
        read_partition,
        write_dataset,
    )
    from ttft.collectors.errors import TraceFileError
    from ttft.collectors.importers.mapping import StageMapping, default_mapping, load_mapping
    from ttft.collectors.join import JoinReport, join_traces
    from ttft.collectors.location import TraceLocation
    from ttft.collectors.otel_exporter import ParquetSpanExporter
    from ttft.collectors.otlp_grpc import OTLPGrpcReceiver
    from ttft.collectors.otlp_receiver import OTLPReceiver
    from ttft.collectors.reader import guess_format, read_inputs, read_spans, run_metadata
    from ttft.collectors.rows import Event, Link, event_span_id, span_rows
    from ttft.collectors.trace_run import TraceRun, TraceSpec, trace_server
    from ttft.collectors.writer import TraceWriter, write_trace

_EXPORTS = {
    "DATASET_FILE": "ttft.collectors.dataset",
    "Event": "ttft.collectors.rows",
    "JoinReport": "ttft.collectors.join",
    "Link": "ttft.collectors.rows",
    "OTLPGrpcReceiver": "ttft.collectors.otlp_grpc",
    "OTLPReceiver": "ttft.collectors.otlp_receiver",
    "ParquetSpanExporter": "ttft.collectors.otel_exporter",
    "StageMapping": "ttft.collectors.importers.mapping",
    "TraceFileError": "ttft.collectors.errors",
    "TraceLocation": "ttft.collectors.location",
    "TraceRun": "ttft.collectors.trace_run",
    "TraceSpec": "ttft.collectors.trace_run",
    "TraceWriter": "ttft.collectors.writer",
    "dataset_info": "ttft.collectors.dataset",
    "default_mapping": "ttft.collectors.importers.mapping",
    "event_span_id": "ttft.collectors.rows",
    "guess_format": "ttft.collectors.reader",
    "is_dataset": "ttft.collectors.dataset",
    "join_traces": "ttft.collectors.join",
    "load_mapping": "ttft.collectors.importers.mapping",
    "read_inputs": "ttft.collectors.reader",
    "read_partition": "ttft.collectors.dataset",
    "read_spans": "ttft.collectors.reader",
    "run_metadata": "ttft.collectors.reader",
    "span_rows": "ttft.collectors.rows",
    "to_span_table": "ttft.collectors._spans",
    "trace_server": "ttft.collectors.trace_run",
    "write_dataset": "ttft.collectors.dataset_write",
    "write_trace": "ttft.collectors.writer",
}

__all__ = [
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
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
