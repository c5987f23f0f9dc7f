"""Names from a trace never become markup in the HTML report's charts: plotly reads a subset
of HTML in labels, hovers and titles, so a service, clock or span name holding ``<a href>``
or ``<span style>`` would be a live link or restyled text. Rendered in a real Chromium
(issue 37)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from _browser import open_offline, page

from ttft.analysis.pipeline import analyze
from ttft.collectors.synthetic import generate
from ttft.reports.html_report import write_html
from ttft.reports.report_data import build_report

LINK = '<a href="https://example.com/x">link</a>'
STYLE = '<span style="font-size:60px">big</span>'


def hostile() -> pa.Table:
    """A synthetic trace whose server's host clock is named ``host:`` + `LINK` + `STYLE`
    and whose queue spans are named `LINK`: the waterfalls' lanes (named by clock) and
    some span names hold markup."""
    table = generate(60, seed=3).table
    clock = table.column("clock")
    clocks = pc.if_else(pc.equal(clock, "host:synth"), f"host:{LINK}{STYLE}", clock)
    names = pc.if_else(pc.equal(table.column("stage"), "queue"), LINK, table.column("name"))
    table = table.set_column(table.schema.get_field_index("clock"), "clock", clocks)
    return table.set_column(table.schema.get_field_index("name"), "name", names)


def test_trace_names_in_charts_stay_text(tmp_path):
    data = build_report(analyze(hostile(), trace="hostile"))
    assert data.waterfalls and any(LINK in set(w.spans["name"]) for w in data.waterfalls)
    out = tmp_path / "r.html"
    write_html(out, data)
    with page() as pg:
        errors, refused = open_offline(pg, out)
        assert errors == [] and refused == []
        found = pg.evaluate("""() => {
            const plots = [...document.querySelectorAll('.js-plotly-plot')];
            const inside = sel => plots.flatMap(p => [...p.querySelectorAll(sel)]);
            return {
                links: inside('a').map(a => a.getAttribute('href') || a.getAttribute('xlink:href')),
                styled: inside('tspan[style*="60px"], text[style*="60px"]').length,
                ticks: inside('.ytick text').map(t => t.textContent),
            };
        }""")
    assert [href for href in found["links"] if href and "example.com" in href] == []
    assert found["styled"] == 0
    # the lanes show the clock's name as it is, markup and all, as text
    assert any(LINK + STYLE in tick for tick in found["ticks"]), found["ticks"]
