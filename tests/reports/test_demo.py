"""`ttft demo` end to end, small: the capacity probe, the in-process server, the load
generator, one trace; and the lines the command prints."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from ttft.collectors.load_rates import LoadRates
from ttft.reports.cli import app
from ttft.reports.runs import capacity as capacity_run
from ttft.reports.runs import demo as demo_run

runner = CliRunner()


def _flat(text: str) -> str:
    """The text with the terminal's line wrapping undone."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A demo of 8 requests with no rate given: the probe (at most 10 s) chooses it."""
    rates = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TTFT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        result = demo_run.run_demo(tmp_path_factory.mktemp("demo"), requests=8, model="tiny",
                                   probe_max_s=10.0, on_rate=lambda *args: rates.append(args))
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
    assert capacity is not None and capacity.concurrency == capacity_run.PROBE_CONCURRENCY
    # settled, the rate counts whole rounds after the warm-up round, PROBE_MIN_BATCHES or more
    assert not capacity.settled or (
        capacity.completions % capacity.concurrency == 0
        and capacity.completions >= capacity_run.PROBE_MIN_BATCHES * capacity.concurrency)
    assert capacity.rate_per_s == pytest.approx(capacity.completions / capacity.seconds)
    # it stopped once settled (10%), or at the first completion after 10 s
    assert capacity.settled or capacity.probe_s >= 10.0
    assert 0 < capacity.spread_per_s and capacity.probe_s > capacity.seconds
    assert demo_run.LOAD_FRACTION == 0.6
    assert result.rate_per_s == pytest.approx(0.6 * capacity.rate_per_s, abs=0.005)
    assert rates == [(capacity, result.rate_per_s, 8)]  # told before the run
    load = result.load
    assert (load.requests, load.completed) == (8, 8) and load.load_s > 0
    # what the seeded schedule offered, not the nominal rate
    assert load.offered_rate_per_s == pytest.approx(
        demo_run.schedule_rate_per_s(result.rate_per_s, 8, 0))
    assert load.achieved_rate_per_s is not None and load.achieved_rate_per_s > 0


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
    schedule = demo_run.schedule_rate_per_s(50, 8, 0)
    assert f"the schedule offered {schedule:.2f} requests/s)" in printed
    assert f"seed 0's 8 arrivals come at {schedule:.2f}/s" in printed
    assert "shed" not in printed and "failed of" not in printed
    assert (out / "report.html").exists()


def test_the_command_prints_capacity_offered_achieved_and_one_line_for_shed_load(
        probed, tmp_path, monkeypatch):
    result, _ = probed
    capacity = capacity_run.Capacity(rate_per_s=3.3, spread_per_s=0.21, completions=40,
                                     seconds=12.1, concurrency=8, probe_s=15.2)
    overloaded = dataclasses.replace(
        result, requests=8, errors=5, shed=3, capacity=capacity, rate_per_s=1.98,
        load=LoadRates(requests=8, completed=3, load_s=2.5, offered_rate_per_s=1.9,
                       achieved_rate_per_s=1.2))
    calls = []

    def fake_run_demo(out, *, on_rate, **kwargs):
        calls.append(kwargs["rate_per_s"])
        out.mkdir(parents=True, exist_ok=True)
        on_rate(capacity, 1.98, 8)
        return overloaded

    monkeypatch.setattr(demo_run, "run_demo", fake_run_demo)
    out = tmp_path / "demo"
    cli = runner.invoke(app, ["demo", "--requests", "8", "--model", "tiny", "-o", str(out)])
    assert cli.exit_code == 0, cli.output
    assert calls == [None]  # no --rate: the run measures the capacity
    printed = _flat(cli.stderr)
    assert ("measuring capacity: 8 requests in flight until the rate is known to 10%, at most "
            "30 s (--rate skips this)") in printed
    assert ("capacity: 3.30 ± 0.21 requests/s (95% interval; 40 completions after the "
            "warm-up, 8 in flight, probe 15.2 s)") in printed
    assert "known only to" not in printed  # 6% is settled
    assert "offered rate: 1.98 requests/s (Poisson), 60% of the capacity" in printed
    lines = cli.stderr.splitlines()
    assert ("achieved rate: 1.20 requests/s (3 of 8 completed in 2.5 s; the schedule offered "
            "1.90 requests/s)") in lines
    assert [line for line in lines if "did not keep up" in line] == [
        "the server did not keep up: offered 1.90 requests/s, achieved 1.20 requests/s (under "
        "85% of it), so TTFT includes queueing from overload; lower --rate to see it unloaded"]
    warnings = [line for line in lines if "shed" in line]
    assert warnings == ["3 shed (HTTP 429/503) and 2 failed of 8 requests: lower the load "
                        "with --rate (offered 1.98/s)"]


def test_an_unsettled_capacity_says_how_well_it_is_known(probed, tmp_path, monkeypatch):
    result, _ = probed
    capacity = capacity_run.Capacity(rate_per_s=1.3, spread_per_s=0.41, completions=24,
                                     seconds=18.5, concurrency=8, probe_s=31.2)

    def fake_run_demo(out, *, on_rate, **kwargs):
        out.mkdir(parents=True, exist_ok=True)
        on_rate(capacity, 0.78, 8)
        return result

    monkeypatch.setattr(demo_run, "run_demo", fake_run_demo)
    cli = runner.invoke(app, ["demo", "--requests", "8", "-o", str(tmp_path / "demo")])
    assert cli.exit_code == 0, cli.output
    assert [line for line in cli.stderr.splitlines() if "known only to" in line] == [
        "the capacity is known only to ±32% (the probe stops at 10% or its time limit): this "
        "machine is busy or noisy; --rate R sets the load instead"]


def test_a_slow_machine_demo_sends_about_a_minute_of_arrivals(probed, tmp_path, monkeypatch):
    # 0.49 requests/s (a busy 2-core machine): 200 arrivals would take 400 s; the demo sends
    # about 60 s of them, at least 50, and says why; a fast one sends 200; --requests wins.
    assert [demo_run.demo_requests(r) for r in (0.3, 0.49, 2.0, 3.5, 40.0)] == [
        50, 50, 120, 200, 200]
    result, _ = probed
    asked = []

    def fake_run_demo(out, *, on_rate, requests, **kwargs):
        asked.append(requests)
        out.mkdir(parents=True, exist_ok=True)
        on_rate(None, 0.49, demo_run.demo_requests(0.49) if requests is None else requests)
        return result

    monkeypatch.setattr(demo_run, "run_demo", fake_run_demo)
    cli = runner.invoke(app, ["demo", "--rate", "0.49", "-o", str(tmp_path / "demo")])
    assert cli.exit_code == 0, cli.output
    assert "50 requests, not 200: about 60 s of arrivals at this rate (--requests N sets " \
        "it)" in _flat(cli.stderr)
    cli = runner.invoke(app, ["demo", "--rate", "0.49", "--requests", "9",
                              "-o", str(tmp_path / "demo")])
    assert cli.exit_code == 0, cli.output
    assert asked == [None, 9] and "not 200" not in _flat(cli.stderr)
