"""Spans placed from a server's reported timings (service ``server-reported``, client clock,
``ttft.estimated``): a request without measured server spans is attributed from them, so
queue and prefill are named instead of one ``untraced`` part; a request whose server also
exported spans is attributed from those alone, its reported spans kept in the table but
taking no time (docs/attribution.md, "Server-reported timings")."""

from __future__ import annotations

from _build import event, row, table

from ttft.analysis import analyze, blame
from ttft.tracer.schema import ATTR_ESTIMATED, REPORTED_SERVICE

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
CLIENT = {"clock": "client", "service": "loadgen"}
REPORTED = {"clock": "client", "service": REPORTED_SERVICE, ATTR_ESTIMATED: "placed"}
SERVER = {"clock": "host:srv", "service": "srv"}


def request(trace: int, *, measured: bool) -> list[dict]:
    """A client window of 100 ms with reported queue [20, 50) and prefill [50, 100); with
    ``measured``, the server's own spans too: server [10, 95) ms, first_byte at 92, queue
    [15, 40), prefill [40, 90)."""
    at = T0 + trace * 1000 * MS

    def ms(n: int) -> int:
        return at + n * MS

    rows = [
        row(trace, 1, "client", ms(0), ms(120), outcome="ok", status_code=200, **CLIENT),
        event(trace, 2, "first_token", ms(100), parent=1, **CLIENT),
        row(trace, 3, "queue", ms(20), ms(50), parent=1, **REPORTED),
        row(trace, 4, "prefill", ms(50), ms(100), parent=1, **REPORTED),
    ]
    if measured:
        rows += [
            row(trace, 5, "server", ms(10), ms(95), parent=1, **SERVER),
            event(trace, 6, "first_byte", ms(92), parent=5, **SERVER),
            row(trace, 7, "queue", ms(15), ms(40), parent=5, **SERVER),
            row(trace, 8, "prefill", ms(40), ms(90), parent=5, **SERVER),
        ]
    return rows


def parts(measured: bool) -> dict[str, float]:
    analysed = analyze(table(request(1, measured=measured)))
    attributed = analysed.attribution.attributed.iloc[0]
    return {stage: ns / MS for stage, ns in attributed.items() if ns}


def test_without_server_spans_the_reported_ones_name_queue_and_prefill():
    assert parts(measured=False) == {"queue": 30.0, "prefill": 50.0, "untraced": 20.0}


def test_measured_server_spans_win_and_the_reported_ones_take_no_time():
    # as if no span had been reported: network outside the server window [10, 92), the
    # server's root-only time inside it
    assert parts(measured=True) == {"queue": 25.0, "prefill": 50.0, "server": 7.0,
                                    "network": 18.0}
    analysed = analyze(table(request(1, measured=True)))
    kept = analysed.assembly.rows.table.column("service").to_pylist()
    assert kept.count(REPORTED_SERVICE) == 2  # in the trace, for comparison


def test_the_rule_is_per_request():
    analysed = analyze(table(request(1, measured=False) + request(2, measured=True)))
    frame = analysed.attribution.attributed
    assert frame["untraced"].tolist() == [20 * MS, 0]
    assert frame["network"].tolist() == [0, 18 * MS]
    assert frame["queue"].tolist() == [30 * MS, 25 * MS]


def test_blame_splits_measured_waits_only():
    no_steps = blame(analyze(table(request(1, measured=False))).assembly)
    assert no_steps.empty  # a reported wait has no engine steps to split it by
    measured = blame(analyze(table(request(1, measured=True))).assembly)
    assert measured[["wait", "wait_ns", "idle_ns"]].to_dict("records") == [
        {"wait": "queue", "wait_ns": 25 * MS, "idle_ns": 25 * MS}]
