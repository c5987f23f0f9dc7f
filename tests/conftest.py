"""Test-wide settings.

Under CI (``CI`` set in the environment) Hypothesis runs derandomized: the same examples
every run, so a landing never depends on luck; local runs keep exploring new examples.
Neither has a per-example deadline.
"""

from __future__ import annotations

import os

import pytest
from _live import Collect
from hypothesis import settings

import ttft.tracer as tt

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
# No per-example deadline anywhere: on a busy shared machine it fails tests for being slow,
# which is never what they test.
settings.register_profile("local", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "local")


@pytest.fixture
def collect():
    """``(exporter, tracing)``: the recorder configured with a collecting exporter, shut
    down after the test."""
    exporter = Collect()
    tracing = tt.configure("engine", [exporter], flush_interval_s=0.02)
    yield exporter, tracing
    tracing.shutdown()
