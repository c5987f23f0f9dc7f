"""Trace ids are random in every part (W3C trace context: the right-most 7 bytes at least)."""

from __future__ import annotations

import collections
import os

import pytest

from ttft.tracer.context import format_traceparent, new_trace_id


def test_trace_ids_differ_in_their_leftmost_and_rightmost_digits():
    ids = [f"{new_trace_id():032x}" for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    # A run's ids used to share their first 28 hex digits (a per-process high half over a
    # counter), so every label cut from the left named one request.
    assert len({i[:12] for i in ids}) == len(ids)
    assert len({i[-14:] for i in ids}) == len(ids)
    assert all(len(i) == 32 and int(i, 16) != 0 for i in ids)


def test_every_hex_digit_position_is_spread_over_all_sixteen_values():
    ids = [f"{new_trace_id():032x}" for _ in range(4000)]
    for position in range(32):
        counts = collections.Counter(i[position] for i in ids)
        assert len(counts) == 16
        # 250 expected per digit; a counter's high digits would hold one value.
        assert max(counts.values()) < 2.5 * 4000 / 16


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_draws_ids_of_its_own():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: draw and report, then leave at once
        os.write(write, f"{new_trace_id():032x}".encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = f"{new_trace_id():032x}"
    assert len(child) == 32 and child != parent


def test_the_traceparent_carries_the_random_id_whole():
    trace_id = new_trace_id()
    header = format_traceparent(trace_id, 1)
    assert header.split("-")[1] == f"{trace_id:032x}"
