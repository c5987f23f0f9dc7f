"""Test-wide settings.

Under CI (``CI`` set in the environment) Hypothesis runs derandomized: the same examples
every run, so a landing never depends on luck; local runs keep exploring new examples.
Neither has a per-example deadline.

A test run started in the background of a non-interactive shell (``pytest &`` in a script)
inherits SIGINT ignored, and so would every command the tests start, which then never see
the Ctrl-C the tests send them (``ttft serve`` and ``ttft trace`` stop on it): the runner
restores Python's handler, so the commands it starts inherit the default again.
"""

from __future__ import annotations

import os
import signal

import pytest
from _live import Collect
from hypothesis import settings

import ttft.tracer as tt

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
# No per-example deadline anywhere: on a busy shared machine it fails tests for being slow,
# which is never what they test.
settings.register_profile("local", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "local")

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def collect():
    """``(exporter, tracing)``: the recorder configured with a collecting exporter, shut
    down after the test."""
    exporter = Collect()
    tracing = tt.configure("engine", [exporter], flush_interval_s=0.02)
    yield exporter, tracing
    tracing.shutdown()
