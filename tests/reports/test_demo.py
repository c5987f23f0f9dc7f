"""`ttft demo` end to end, small: the capacity probe, the in-process server, the load
generator, one trace; and the lines the command prints."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from ttft.reports.cli import app
from ttft.reports.runs import demo as demo_run

runner = CliRunner()


def _flat(text: str) -> str:
    """The text with the terminal's line wrapping undone."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A demo of 8 requests with no rate given: the probe (1 s) chooses it."""
    rates = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TTFT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        result = demo_run.run_demo(tmp_path_factory.mktemp("demo"), requests=8, model="tiny",
                                   probe_s=1.0, on_rate=lambda *args: rates.append(args))
    return result, rates


def test_demo_traces_client_and_server_into_one_analyzable_trace(probed):
    result, _ = probed
    assert (result.requests, result.errors, result.shed) == (8, 0, 0)
    summary = result.summary.to_dict()
    # the probe's requests went to a server of its own, untraced: only the demo's are here
    assert summary["boundary"] == "client" and summary["requests"] == 8
    stages = summary["stages"]
    for stage in ("network", "server", "queue", "prefill.chunk", "tokenize"):
        assert stage in stages, stage
    assert abs(sum(s["share"] for s in stages.values()) - 1.0) < 1e-9
    # the warm-up went out "not sampled": nothing of it is recorded, not even engine steps
    assert summary["quality"]["no_window"] == 0
    assert result.trace.exists()


def test_without_a_rate_the_probe_runs_and_the_demo_offers_60_percent(probed):
    result, rates = probed
    capacity = result.capacity
    assert capacity is not None and capacity.concurrency == demo_run.PROBE_CONCURRENCY
    assert capacity.requests >= 1
    # it stopped at the first completion after 1 s, unless every probe request was done
    assert capacity.seconds >= 1.0 or capacity.requests == demo_run.PROBE_REQUESTS
    assert capacity.rate_per_s == pytest.approx(capacity.requests / capacity.seconds)
    assert demo_run.LOAD_FRACTION == 0.6
    assert result.offered_rate_per_s == pytest.approx(0.6 * capacity.rate_per_s, abs=0.005)
    assert rates == [(capacity, result.offered_rate_per_s)]  # told before the run
    assert result.completed == 8 and result.load_s > 0
    assert result.achieved_rate_per_s == pytest.approx(8 / result.load_s)


def test_an_explicit_rate_is_used_as_given_without_a_probe(tmp_path, monkeypatch):
    monkeypatch.setenv("TTFT_CACHE_DIR", str(tmp_path / "cache"))
    probes = []
    monkeypatch.setattr(demo_run, "probe_capacity", lambda *a, **k: probes.append(a))
    out = tmp_path / "demo"
    result = runner.invoke(app, ["demo", "--requests", "8", "--model", "tiny", "--rate", "50",
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert probes == []
    printed = _flat(result.stderr)
    assert "measuring capacity" not in printed and "capacity:" not in printed
    assert "offered rate: 50.00 requests/s (Poisson), as given by --rate" in printed
    assert "achieved rate: " in printed and "8 of 8 completed in " in printed
    assert "offered 50.00 requests/s)" in printed
    assert "shed" not in printed and "failed of" not in printed
    assert (out / "report.html").exists()


def test_the_command_prints_capacity_offered_achieved_and_one_line_for_shed_load(
        probed, tmp_path, monkeypatch):
    result, _ = probed
    capacity = demo_run.Capacity(rate_per_s=3.3, requests=14, seconds=4.24, concurrency=4)
    overloaded = dataclasses.replace(result, errors=5, shed=3, capacity=capacity,
                                     offered_rate_per_s=1.98, completed=3, load_s=2.5,
                                     achieved_rate_per_s=1.2)
    calls = []

    def fake_run_demo(out, *, on_rate, **kwargs):
        calls.append(kwargs["rate_per_s"])
        out.mkdir(parents=True, exist_ok=True)
        on_rate(capacity, 1.98)
        return overloaded

    monkeypatch.setattr(demo_run, "run_demo", fake_run_demo)
    out = tmp_path / "demo"
    cli = runner.invoke(app, ["demo", "--requests", "8", "--model", "tiny", "-o", str(out)])
    assert cli.exit_code == 0, cli.output
    assert calls == [None]  # no --rate: the run measures the capacity
    printed = _flat(cli.stderr)
    assert "measuring capacity: 4 requests in flight for about 4 s (--rate skips this)" in printed
    assert "capacity: 3.30 requests/s (14 completed with 4 in flight in 4.2 s)" in printed
    assert "offered rate: 1.98 requests/s (Poisson), 60% of the capacity" in printed
    assert ("achieved rate: 1.20 requests/s (3 of 8 completed in 2.5 s; offered 1.98 "
            "requests/s)") in printed
    warnings = [line for line in cli.stderr.splitlines() if "shed" in line]
    assert warnings == ["3 shed (HTTP 429/503) and 2 failed of 8 requests: lower the load "
                        "with --rate (offered 1.98/s)"]
