"""``reports.arrow_pool``: a ``ttft`` command's own process uses the C library's allocator
for Arrow unless the user chose a pool (docs/architecture.md, "Arrow's memory pool").

Arrow reads its variable once per process, so each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ttft.reports import arrow_pool

PROBE = """
import json, os, sys
from ttft.reports import arrow_pool
{before}
chosen = arrow_pool.choose_for_command()
import pyarrow as pa
print(json.dumps([chosen, arrow_pool.chosen_here(), os.environ.get(arrow_pool.VARIABLE),
                  pa.default_memory_pool().backend_name]))
"""


def probe(before: str = "", **environ: str) -> list:
    env = {k: v for k, v in os.environ.items() if k != arrow_pool.VARIABLE}
    result = subprocess.run([sys.executable, "-c", PROBE.format(before=before)],
                            capture_output=True, text=True, timeout=60, env={**env, **environ})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_command_s_process_uses_the_system_allocator():
    assert probe() == [True, True, arrow_pool.COMMAND_POOL, "system"]


@pytest.mark.parametrize("pool", ["mimalloc", "jemalloc", "system"])
def test_a_pool_the_user_chose_is_kept(pool):
    import pyarrow as pa

    backends = {"mimalloc": pa.mimalloc_memory_pool, "jemalloc": pa.jemalloc_memory_pool}
    try:
        backends.get(pool, pa.system_memory_pool)()
    except NotImplementedError:
        pytest.skip(f"this pyarrow is built without {pool}")
    assert probe(**{arrow_pool.VARIABLE: pool}) == [False, False, pool, pool]


def test_nothing_is_set_once_pyarrow_is_loaded():
    """Setting the variable then would change nothing, so it is not set; the pool stays
    Arrow's own default."""
    chosen, here, variable, backend = probe(before="import pyarrow")
    assert (chosen, here, variable) == (False, False, None)
    assert backend != "system"


def test_the_ttft_command_chooses_it_before_any_command_runs():
    """``python -m ttft.reports.cli`` (the console script's ``main``): the command's
    process has the variable set, and the analysis in it runs on that pool."""
    code = ("import sys, runpy; sys.argv = ['ttft', '--help']\n"
            "try:\n    runpy.run_module('ttft.reports.cli', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "import os, pyarrow as pa\n"
            "print(os.environ.get('ARROW_DEFAULT_MEMORY_POOL'), "
            "pa.default_memory_pool().backend_name)")
    env = {k: v for k, v in os.environ.items() if k != arrow_pool.VARIABLE}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["system", "system"]
