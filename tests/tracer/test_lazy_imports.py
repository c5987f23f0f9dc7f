"""Import cost: reading the span vocabulary or analysing a trace loads neither torch nor the
OpenTelemetry SDK; ``ttft.tracer``'s torch and SDK names load them on first access only.

Each case runs in a fresh interpreter, since this one has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "opentelemetry.sdk")

ANALYSIS_MODULES = """
import pkgutil, ttft.analysis
for info in pkgutil.walk_packages(ttft.analysis.__path__, "ttft.analysis."):
    __import__(info.name)
"""


def loaded_after(code: str) -> list[str]:
    """The heavy packages in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = (
        f"{code}\nimport json, sys\n"
        f"print(json.dumps([h for h in {HEAVY!r} "
        "if any(m == h or m.startswith(h + '.') for m in sys.modules)]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "code",
    [
        "import ttft.tracer.schema",
        "import ttft.tracer",
        "import ttft.tracer.context",
        "from ttft.tracer import SPAN_SCHEMA, STAGE_NAMES, parse_traceparent, request_context",
        "import ttft.analysis",
        ANALYSIS_MODULES,
    ],
    ids=["schema", "tracer", "context", "light-names", "analysis", "analysis-modules"],
)
def test_reading_the_vocabulary_loads_neither_torch_nor_the_sdk(code):
    assert loaded_after(code) == []


def test_the_recording_api_loads_the_sdk_on_first_access_and_not_torch():
    assert loaded_after("import ttft.tracer\nttft.tracer.configure") == ["opentelemetry.sdk"]


def test_the_torch_hooks_load_torch_on_first_access():
    assert loaded_after("import ttft.tracer\nttft.tracer.instrument_module") == list(HEAVY)


def test_the_hooks_import_by_name_from_the_package():
    code = (
        "from ttft.tracer import TTFTMiddleware, instrument_module\n"
        "from ttft.tracer.asgi import TTFTMiddleware as asgi_middleware\n"
        "from ttft.tracer.torch_hooks import instrument_module as hook\n"
        "assert (TTFTMiddleware, instrument_module) == (asgi_middleware, hook)"
    )
    assert loaded_after(code) == list(HEAVY)


def test_lazy_names_are_listed_and_an_unknown_name_is_an_attribute_error():
    code = (
        "import ttft.tracer\n"
        "names = dir(ttft.tracer)\n"
        "assert set(ttft.tracer.__all__) <= set(names), names\n"
        "try:\n"
        "    ttft.tracer.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')"
    )
    assert loaded_after(code) == []


def test_the_command_line_loads_no_table_library_to_show_its_help():
    """``ttft --help`` (every command's module imported to list it) loads neither pyarrow,
    numpy nor pandas: those come with the command that reads a trace."""
    probe = (
        "import sys\nfrom typer.main import get_command\nfrom ttft.reports.cli import app\n"
        "get_command(app)\n"
        "print(sorted(m for m in ('pyarrow', 'numpy', 'pandas', 'torch') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
