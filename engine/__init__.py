"""ttft.engine: the reference inference engine ttft traces (not built yet)."""
