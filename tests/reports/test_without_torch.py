"""Tracing and analysing need no PyTorch (it is the ``engine`` extra): ``ttft synth``,
``analyze``, ``report``, ``trace`` and ``collect`` run in a process where ``import torch``
fails, and ``ttft serve``, ``demo``, ``profile-prefill`` and ``validate`` there say in one
line what to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ttft.engine.server import build_engine, serving

NO_TORCH = '''\
import sys


class _NoTorch:
    """Makes torch unimportable, as in an install without the engine extra."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
'''


@pytest.fixture(scope="module")
def no_torch_env(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that cannot import torch."""
    site = tmp_path_factory.mktemp("no-torch")
    (site / "sitecustomize.py").write_text(NO_TORCH)
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _command() -> list[str]:
    beside = Path(sys.executable).parent / "ttft"
    return [str(beside) if beside.exists() else "ttft"]


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*_command(), *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_environment_really_hides_torch(no_torch_env):
    result = subprocess.run([sys.executable, "-c", "import torch"], env=no_torch_env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "No module named 'torch'" in result.stderr


def test_synth_analyze_and_report_need_no_torch(no_torch_env, tmp_path):
    trace, page = tmp_path / "synth.parquet", tmp_path / "report.html"
    for args in (["synth", "-o", str(trace), "--requests", "50"],
                 ["analyze", str(trace)], ["analyze", str(trace), "--json"],
                 ["report", str(trace), "-o", str(page)]):
        result = _run(no_torch_env, *args)
        assert result.returncode == 0, (args, result.stderr)
    assert page.stat().st_size > 0


def test_trace_and_collect_need_no_torch(no_torch_env, tmp_path):
    cache = str(tmp_path / "tokenizer")
    with serving(build_engine("tiny", device="cpu", tokenizer_cache_dir=cache),
                 model_name="tiny") as url:  # the server, in this process, has torch
        traced = _run(no_torch_env, "trace", url, "--burst", "2", "--prompt-tokens", "12",
                      "--output-tokens", "2", "--receiver-port", "0", "--span-wait", "0.2",
                      "-o", str(tmp_path / "run.parquet"))
    assert traced.returncode == 0, traced.stderr
    assert "2 requests (0 failed)" in traced.stderr
    collected = _run(no_torch_env, "collect", "-o", str(tmp_path / "spans"), "--http-port", "0",
                     "--grpc-port", "0", "--duration", "0.2")
    assert collected.returncode == 0, collected.stderr


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["demo", "--requests", "2"],
                                     ["profile-prefill", "-o", "profile.parquet"],
                                     ["validate", "--requests", "2"]])
def test_engine_commands_without_torch_say_what_to_install(no_torch_env, tmp_path, command):
    result = subprocess.run([*_command(), *command], env=no_torch_env, capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert (result.returncode, result.stderr.strip()) == (
        2, f"error: ttft {command[0]} needs PyTorch, which is not installed: "
           "pip install 'ttft[engine]'")
    assert list(tmp_path.iterdir()) == []  # nothing written
