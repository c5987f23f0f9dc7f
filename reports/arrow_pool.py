"""Which allocator Arrow uses in a ``ttft`` command's own process (docs/architecture.md,
"Arrow's memory pool").

A command runs once: every buffer it reads or computes is fresh memory. On this project's
machine, Arrow's default pool (mimalloc) spent 0.9–2.0 s of system time on reading and
analysing 2.4M spans where the C library's allocator spent 0.5–0.7 s, and 15 s against
6.5 s on 23.8M, ending 0.13 and 0.9 GB lower. A long-lived Dask worker reuses what its
pool keeps between partitions, and there mimalloc was the faster (10.7 s against 12.4 s
for 16 partitions of 10M spans on one worker), so the workers of a cluster ``ttft``
starts keep Arrow's default (``reports/runs/runners.local_cluster``).

Arrow reads ``ARROW_DEFAULT_MEMORY_POOL`` once, when its default pool is first asked for,
so `choose_for_command` must run before anything in the process imports pyarrow. A value
the user gave is theirs and is never changed.
"""

from __future__ import annotations

import os
import sys

__all__ = ["COMMAND_POOL", "VARIABLE", "choose_for_command", "chosen_here"]

VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
COMMAND_POOL = "system"
"""The pool a command's own process uses unless the user chose one."""

_chosen = False


def choose_for_command() -> bool:
    """Set `VARIABLE` to `COMMAND_POOL` where the user left it unset and pyarrow is not yet
    loaded (else it would have no effect); whether it was set here."""
    global _chosen
    if VARIABLE not in os.environ and "pyarrow" not in sys.modules:
        os.environ[VARIABLE] = COMMAND_POOL
        _chosen = True
    return _chosen


def chosen_here() -> bool:
    """Whether `choose_for_command` set `VARIABLE` in this process (and not the user), so
    that processes started from it for another purpose can leave it unset."""
    return _chosen and os.environ.get(VARIABLE) == COMMAND_POOL
