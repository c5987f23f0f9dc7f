"""ttft.tracer: the span vocabulary (``ttft.tracer.schema``) every other package uses."""

from ttft.tracer.schema import SCHEMA_VERSION, SPAN_SCHEMA, STAGE_NAMES

__all__ = ["SCHEMA_VERSION", "SPAN_SCHEMA", "STAGE_NAMES"]
