"""At the client boundary, a request without a server window has its root-only time named
`untraced` (the server and the network together, unseen), never `network`."""

from __future__ import annotations

import pytest
from _build import event, row, table, tid

from ttft.analysis import analyze, assemble, attribute
from ttft.tracer.schema import POLICIES, root_only_stage

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def client_only(trace: int, ttft_ms: int) -> list[dict]:
    t0 = T0 + trace * 100 * MS
    return [
        row(trace, 1, "client", t0, t0 + 60 * MS, clock="client", service="loadgen",
            outcome="ok", status_code=200),
        event(trace, 2, "first_token", t0 + ttft_ms * MS, parent=1, clock="client",
              service="loadgen"),
    ]


def with_server(trace: int) -> list[dict]:
    """A client window of 40 ms holding a server window of 30 ms: 10 ms is the network's."""
    t0 = T0 + trace * 100 * MS
    rows = client_only(trace, 40)
    rows += [
        row(trace, 3, "server", t0 + 5 * MS, t0 + 50 * MS, parent=1, service="api"),
        row(trace, 4, "queue", t0 + 10 * MS, t0 + 30 * MS, parent=3, service="api"),
        event(trace, 5, "first_byte", t0 + 35 * MS, parent=3, service="api"),
    ]
    return rows


def engine_only(trace: int) -> list[dict]:
    """Engine spans came (a server exporting its engine's spans) but no server span: the time
    around them is still the server's and the network's, not the network's alone."""
    t0 = T0 + trace * 100 * MS
    rows = client_only(trace, 40)
    rows.append(row(trace, 3, "queue", t0 + 10 * MS, t0 + 30 * MS, parent=1, service="engine"))
    return rows


@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_no_server_traced_is_untraced_not_network(policy):
    attr = attribute(assemble(table(client_only(0, 25) + with_server(1) + engine_only(2))),
                     "client", policy)
    parts = {t: dict(attr.attributed.iloc[i][attr.attributed.iloc[i] > 0] // MS)
             for i, t in enumerate(attr.requests["trace_id"])}
    assert parts[tid(0)] == {"untraced": 25}
    assert parts[tid(1)]["network"] == 10 and "untraced" not in parts[tid(1)]
    assert parts[tid(2)] == {"untraced": 20, "queue": 20}
    assert (attr.attributed.sum(axis=1).to_numpy() == attr.requests["ttft_ns"]).all()
    # untraced is derived time: its covered and raw are its attributed time, as network's
    assert (attr.covered["untraced"] == attr.attributed["untraced"]).all()


def test_the_rule_lives_in_one_place():
    assert root_only_stage("client", server_window=False) == "untraced"
    assert root_only_stage("client") == "network"
    assert root_only_stage("server", server_window=False) == "server"


def test_the_json_summary_names_untraced_time():
    summary = analyze(table([r for i in range(5) for r in client_only(i, 20 + i)])).summary
    stages = summary.to_dict()["stages"]
    assert stages["untraced"]["share"] == pytest.approx(1.0)
    assert "network" not in stages or stages["network"]["mean"] == 0


def test_analyze_says_what_untraced_means_and_how_to_split_it(tmp_path):
    from typer.testing import CliRunner

    from ttft.collectors import write_trace
    from ttft.reports.cli import app

    path = tmp_path / "client-only.parquet"
    write_trace(path, table([r for i in range(5) for r in client_only(i, 20 + i)]))
    out = " ".join(CliRunner().invoke(app, ["analyze", str(path)], env={"COLUMNS": "100"})
                   .output.split())
    assert "│ untraced │" in CliRunner().invoke(app, ["analyze", str(path)]).output
    assert "untraced: time of requests the server sent no span for" in out
    assert "point the server's OTLP exporter at ttft's receiver" in out
    with_spans = tmp_path / "traced.parquet"
    write_trace(with_spans, table(with_server(1)))
    assert "untraced:" not in CliRunner().invoke(app, ["analyze", str(with_spans)]).output
