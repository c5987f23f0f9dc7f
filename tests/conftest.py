"""Test-wide settings.

Under CI (``CI`` set in the environment) Hypothesis runs derandomized: the same examples
every run, so a landing never depends on luck; local runs keep exploring new examples.
"""

from __future__ import annotations

import os

import pytest
from _live import Collect
from hypothesis import settings

import ttft.tracer as tt

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def collect():
    """``(exporter, tracing)``: the recorder configured with a collecting exporter, shut
    down after the test."""
    exporter = Collect()
    tracing = tt.configure("engine", [exporter], flush_interval_s=0.02)
    yield exporter, tracing
    tracing.shutdown()
