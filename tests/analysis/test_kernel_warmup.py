"""Numba's start-up paid during the read (``analysis.kernel_warmup``): started only for an
input of `KERNEL_ROWS` spans or more, with the argument types the analysis then calls the
kernel with (so it loads once, not twice), and the span count read from Parquet footers.

The warm-up cases run in fresh interpreters: this one may have loaded numba already.
"""

from __future__ import annotations

import json
import subprocess
import sys

from ttft.collectors import TraceLocation
from ttft.collectors.layout import stored_spans
from ttft.collectors.synthetic import generate
from ttft.collectors.writer import TraceWriter, write_trace


def run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_too_few_spans_start_nothing_and_load_no_numba():
    found = run(
        "import json, sys, threading\n"
        "from ttft.analysis.kernel_warmup import warm_kernels, KERNEL_ROWS\n"
        "out = [warm_kernels(None), warm_kernels(0), warm_kernels(KERNEL_ROWS - 1)]\n"
        "print(json.dumps({'threads': [t is not None for t in out],\n"
        "                  'numba': 'numba' in sys.modules,\n"
        "                  'named': [t.name for t in threading.enumerate()]}))\n")
    assert found["threads"] == [False, False, False]
    assert found["numba"] is False
    assert "ttft-kernel-warmup" not in found["named"]


def test_the_warmed_kernel_is_the_one_the_step_join_then_calls():
    """After the warm-up, the step join's lookup runs on real keys without loading or
    compiling another version of it: the warm-up used the types the analysis uses."""
    found = run(
        "import json, sys\n"
        "import numpy as np\n"
        "from ttft.analysis.kernel_warmup import warm_kernels, KERNEL_ROWS\n"
        "first = warm_kernels(KERNEL_ROWS)\n"
        "again = warm_kernels(10 * KERNEL_ROWS)\n"
        "first.join(120)\n"
        "from ttft.analysis._kernels import first_of_keys\n"
        "warm = len(first_of_keys.signatures)\n"
        "from ttft.analysis._step_join import _first_hashed, first_merged\n"
        "rng = np.random.default_rng(1)\n"
        "types = (np.int32, np.uint64, np.uint64)\n"
        "keys = tuple(rng.integers(0, 4, 50).astype(t) for t in types)\n"
        "wanted = tuple(rng.integers(0, 4, 20).astype(t) for t in types)\n"
        "same = bool((_first_hashed(keys, wanted) == first_merged(keys, wanted)).all())\n"
        "print(json.dumps({'once': first is again, 'alive': first.is_alive(), 'warm': warm,\n"
        "                  'after': len(first_of_keys.signatures), 'same': same}))\n")
    assert found == {"once": True, "alive": False, "warm": 1, "after": 1, "same": True}


def test_stored_spans_are_read_from_the_footers_of_finished_runs(tmp_path):
    table = generate(30, seed=2).table
    one = tmp_path / "one.parquet"
    write_trace(one, table)
    assert stored_spans(one) == table.num_rows
    assert TraceLocation(str(one)).stored_spans() == table.num_rows
    assert TraceLocation(str(one), format="jaeger").stored_spans() is None
    runs = tmp_path / "runs"
    runs.mkdir()
    write_trace(runs / "a.parquet", table)
    write_trace(runs / "b.parquet", table.slice(0, 7))
    assert TraceLocation(str(runs)).stored_spans() == table.num_rows + 7
    live = TraceWriter(runs / "c.parquet", flush_spans=5, merge_on_close=False)
    live.append(table.slice(0, 12))  # flushed as parts, not closed: an unfinished run
    assert TraceLocation(str(runs)).stored_spans() is None
    live.close()
    other = tmp_path / "spans.json"
    other.write_text('{"resourceSpans": []}')
    assert stored_spans(other) is None
    assert stored_spans(tmp_path / "missing.parquet") is None


def test_kernels_take_smaller_steps_once_numba_is_loaded(monkeypatch):
    from ttft.analysis import _column_arrays as col

    monkeypatch.delitem(sys.modules, "numba", raising=False)
    assert [col.compiled(n) for n in (0, col.LOADED_KERNEL_ROWS, col.KERNEL_ROWS - 1,
                                      col.KERNEL_ROWS)] == [False, False, False, True]
    monkeypatch.setitem(sys.modules, "numba", sys)  # loaded: what is there is not looked at
    assert [col.compiled(n) for n in (0, col.LOADED_KERNEL_ROWS - 1, col.LOADED_KERNEL_ROWS,
                                      col.KERNEL_ROWS)] == [False, False, True, True]
