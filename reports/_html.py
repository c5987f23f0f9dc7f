"""What every HTML page of ttft's is made of: the stylesheet, text escaped for markup, a
figure's panel, a key / value table and a fold (a ``<details>`` element closed until
clicked, under a one-line summary). The pages themselves are ``html_report`` (a trace)
and ``views/sweep.py`` (a load sweep)."""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

_CONFIG = {"displaylogo": False, "responsive": True}
_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       background: #f5f7fa; color: #1f2933; }
main { max-width: 1180px; margin: 0 auto; padding: 24px; }
h1 { margin: 0 0 4px; font-size: 26px; } h2 { margin: 32px 0 8px; font-size: 20px; }
.sub { color: #52606d; margin-bottom: 18px; }
.cards { display: flex; flex-wrap: wrap; gap: 14px; }
.card { background: #fff; border-radius: 10px; padding: 14px 18px; min-width: 250px;
        box-sizing: border-box;
        box-shadow: 0 1px 3px rgba(0,0,0,.12); flex: 1; }
.card h3 { margin: 0 0 6px; font-size: 15px; color: #52606d; font-weight: 600; }
.big { font-size: 28px; font-weight: 700; } .unit { font-size: 14px; color: #52606d; }
.pcts span { margin-right: 14px; } .biggest { margin-top: 8px; }
.swatch { display: inline-block; width: 11px; height: 11px; border-radius: 2px;
          margin-right: 5px; vertical-align: -1px; }
.panel { background: #fff; border-radius: 10px; padding: 8px; margin: 14px 0;
         box-shadow: 0 1px 3px rgba(0,0,0,.12); }
table { border-collapse: collapse; background: #fff; font-size: 13px; width: 100%; }
th, td { padding: 5px 10px; border-bottom: 1px solid #e4e7eb; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.text { text-align: left; } tr.total td { font-weight: 700; border-top: 2px solid #9aa5b1; }
.note { color: #52606d; font-size: 13px; margin: 6px 0 0; }
.ok { color: #2f8132; } .warn { color: #b44d12; }
.failures { color: #b3261e; font-weight: 600; margin-bottom: 4px; }
table.meta { table-layout: fixed; } table.meta th, table.meta td { text-align: left; }
table.meta td:first-child { width: 32%; font-family: ui-monospace, monospace; }
table.meta td { overflow-wrap: anywhere; white-space: pre-wrap; vertical-align: top; }
.load div { margin-bottom: 4px; }
details.fold > summary { cursor: pointer; color: #52606d; padding: 6px 0; }
details.fold[open] > summary { margin-bottom: 6px; }
"""


def _e(value: Any) -> str:
    """``value`` as text safe in markup and in a quoted attribute."""
    return html.escape(str(value), quote=True)


def _ms(value: float) -> str:
    return f"{value:,.2f}"


def _figure(fig: go.Figure | None, div_id: str, empty: str) -> str:
    if fig is None:
        return f'<p class="note">{_e(empty)}</p>'
    body = fig.to_html(full_html=False, include_plotlyjs=False, config=_CONFIG, div_id=div_id)
    return f'<div class="panel">{body}</div>'


def _rows(rows: list[tuple[str, str]], head: str = "", attrs: str = "") -> str:
    """A key / value table (class ``meta``: long values wrap); ``head`` and ``attrs`` are
    markup (a header row, the table's attributes)."""
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table class="meta"{attrs}>{head}{body}</table>'


def folded(summary: str, body: str, fold_id: str) -> str:
    """``body`` (markup) in a ``<details>`` element, closed until clicked, under the one
    line ``summary`` (text: escaped here)."""
    return (f'<details class="fold" id="{_e(fold_id)}"><summary>{_e(summary)}</summary>'
            f"{body}</details>")
