"""Numba's start-up, paid while a command reads its input rather than after.

The first compiled kernel a process calls costs about 0.3 s before it runs (importing
numba, then numba building its typing and lowering registries and loading the kernel from
its cache), whatever the kernel; later kernels load in milliseconds. An analysis of
`KERNEL_ROWS` spans or more calls kernels (``analysis._kernels``), so a command that knows
it is about to read that many (from a Parquet footer) calls `warm_kernels` first: a
background thread pays the start-up while the main thread decodes the file, which Arrow
does without holding the GIL (docs/architecture.md, "Start-up").

Nothing depends on the warm-up having run: a kernel called before it is done waits for
numba's own lock, then loads as it would have, and an error in the thread is dropped (the
kernel called later meets it again and reports it).
"""

from __future__ import annotations

import threading

from ttft.analysis._column_arrays import KERNEL_ROWS

__all__ = ["warm_kernels"]

_lock = threading.Lock()
_thread: threading.Thread | None = None


def warm_kernels(spans: int | None) -> threading.Thread | None:
    """Start numba's start-up in a daemon thread when an analysis of ``spans`` spans will
    call compiled kernels (``spans >= KERNEL_ROWS``); once per process. Returns the thread
    (the one started earlier, if any), or None when ``spans`` is None or too few."""
    global _thread
    if spans is None or spans < KERNEL_ROWS:
        return _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_load, name="ttft-kernel-warmup", daemon=True)
            _thread.start()
    return _thread


def _load() -> None:
    try:
        import numpy as np

        from ttft.analysis import _tree_kernels  # noqa: F401  (its kernels load on first call)
        from ttft.analysis._kernels import first_of_keys

        # The step join's lookup, with the argument types it is always called with
        # (``_step_join._first_hashed``): loading it from the cache initializes numba.
        words = np.zeros(1, np.uint64)
        first_of_keys(words, words, words, words, words, words, np.empty(1, np.int64))
    except Exception:  # noqa: BLE001 - the analysis meets and reports it when it calls one
        return
