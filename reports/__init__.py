"""ttft.reports: the presentation layer and the command line.

Renderers turn an analysis into pictures and text: :func:`build_report` gathers what a
report shows from one :class:`ttft.analysis.Analysis`, :func:`write_html` writes it as one
self-contained HTML file, :func:`render_report` and :func:`render_analysis` print it in the
terminal, :func:`write_perfetto` exports a timeline. The CLI lives in ``reports/cli/`` (one
module per command; :func:`main` is the ``ttft`` entry point) and the runs that drive
several packages in ``reports/runs/``. Nothing else in ttft imports this package.

Names are imported on first use (PEP 562): plotly, typer and the engine load only when
needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ttft.tracer.lazy import lazy_exports

if TYPE_CHECKING:
    from ttft.reports.cli import main
    from ttft.reports.html_report import write_html
    from ttft.reports.perfetto import write_perfetto
    from ttft.reports.report_data import ReportData, build_report
    from ttft.reports.terminal import render_analysis
    from ttft.reports.terminal_report import render_report

_EXPORTS = {
    "ReportData": "ttft.reports.report_data",
    "build_report": "ttft.reports.report_data",
    "main": "ttft.reports.cli",
    "render_analysis": "ttft.reports.terminal",
    "render_report": "ttft.reports.terminal_report",
    "write_html": "ttft.reports.html_report",
    "write_perfetto": "ttft.reports.perfetto",
}

__all__ = [
    "ReportData",
    "build_report",
    "main",
    "render_analysis",
    "render_report",
    "write_html",
    "write_perfetto",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
