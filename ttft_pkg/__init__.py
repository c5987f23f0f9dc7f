"""ttft: where did the time to first token go?

The subpackages live in the repository's root folders and are mapped into this namespace
by ``pyproject.toml``: ``ttft.tracer``, ``ttft.engine``, ``ttft.collectors``,
``ttft.analysis`` and ``ttft.reports``.
"""

__version__ = "0.1.0"
