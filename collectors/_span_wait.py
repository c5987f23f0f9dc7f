"""Waiting for a traced run's server spans after its load (private to ``trace_run``): the
server exports its spans as its requests end, in batches, so they arrive after the client
saw the last byte."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from ttft.collectors._trace_process import TraceProcess

QUIET_S = 1.0
"""A run's spans are taken as complete once no span arrived for this long."""
INTERRUPTED_WAIT_S = 3.0
"""A load stopped by Ctrl-C waits at most this long (and ``span_wait_s``) for the server's
last spans."""


def wait_for_spans(recorder: TraceProcess, wanted: set[str], limit_s: float) -> None:
    """Until every trace of ``wanted`` has spans at ``recorder`` and none arrived for
    `QUIET_S`, or ``limit_s`` passed."""
    deadline = time.monotonic() + limit_s
    last_rows, last_change = -1, time.monotonic()
    recorder.want(wanted)
    while time.monotonic() < deadline:
        complete, rows = recorder.poll()
        if rows != last_rows:
            last_rows, last_change = rows, time.monotonic()
        elif complete and time.monotonic() - last_change >= QUIET_S:
            return
        time.sleep(0.05)


def last_spans(recorder: TraceProcess, span_wait_s: float,
               on_waiting: Callable[[], None] | None) -> None:
    """After the load was stopped (Ctrl-C, SIGTERM): the requests that ended just before the
    stop, and those the stop cancelled (their server ends them when the client hangs up),
    have spans on their way. Wait until none arrived for `QUIET_S`, at most
    `INTERRUPTED_WAIT_S` and ``span_wait_s``; a second Ctrl-C ends the wait at once."""
    if on_waiting is not None:
        on_waiting()
    with contextlib.suppress(KeyboardInterrupt):
        wait_for_spans(recorder, set(), min(span_wait_s, INTERRUPTED_WAIT_S))
