"""`ttft validate --disaggregate`, small: a delay injected into the K/V transfer between a
real prefill worker process and the decode worker comes back out of attribution at the
server boundary within max(1 ms, 5 %), next to the other stages, and a transfer delay
claimed but not applied is caught."""

from __future__ import annotations

import pytest
from _validated import validated
from typer.testing import CliRunner

from ttft.analysis.clocks import estimate_offsets
from ttft.collectors import read_spans, run_metadata
from ttft.reports.cli import app
from ttft.reports.runs.validate import DISAGG_DEFAULT_DELAYS_MS, check_delays, run_validate

runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def tokenizer_cache(tmp_path_factory):
    """One tokenizer cache for the module (the worker inherits it), no peak measurement."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TTFT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        mp.setenv("TTFT_SKIP_PEAKS", "1")
        yield


def test_the_transfer_delay_needs_a_disaggregated_engine():
    assert check_delays(DISAGG_DEFAULT_DELAYS_MS, disaggregate=True)["kv_transfer"] == 15.0
    with pytest.raises(ValueError, match="add --disaggregate"):
        check_delays({"kv_transfer": 10})
    result = runner.invoke(app, ["validate", "--delay", "kv_transfer=10", "-o", "unused"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: kv_transfer has a delay only in a disaggregated")


def test_run_validate_disaggregated_recovers_the_transfer_delay(tmp_path):
    delays = {"queue": 20.0, "kv_transfer": 15.0, "sample": 10.0}
    result = validated(tmp_path, requests=8, model="tiny", delays_ms=delays, disaggregate=True)
    checks = [(c.stage, c.injected_ms, c.tolerance_ms, c.ok) for c in result.stages]
    assert checks == [
        ("queue", 20.0, 1.0, True),
        ("kv_transfer", 15.0, 1.0, True),
        ("sample", 10.0, 1.0, True),
    ], [(c.stage, c.recovered_ms) for c in result.stages]
    assert result.ok and result.failures == []
    spans = read_spans(result.injected.trace)
    services = set(spans.column("service").to_pylist())
    assert {"ttft-prefill", "ttft-validate-injected"} <= services
    names = spans.column("name").to_pylist()
    # one per request: the warm-up is sent not sampled, and leaves no span in either process
    assert names.count("kv_transfer") == result.injected.requests
    mode = run_metadata(spans)["engine"]["disaggregated"]
    assert (mode["first_token"], mode["channel"]) == ("decode", "tcp 127.0.0.1")
    # The worker's clock (host:<name>/prefill) is judged against the server's, and on one
    # host every request fits: a real worker's spans never start before the server's span
    # nor end their prefill after first_byte, so nothing moves.
    (worker,) = [o for o in estimate_offsets(spans) if o.server_clock.endswith("/prefill")]
    assert worker.requests > 0 and worker.violations_before == 0 and not worker.applied


def test_a_transfer_delay_claimed_but_not_applied_is_a_miss(tmp_path):
    result = run_validate(tmp_path, requests=6, model="tiny", delays_ms={"kv_transfer": 15},
                          applied_delays_ms={"kv_transfer": 0}, disaggregate=True)
    (check,) = result.stages
    assert (check.stage, check.ok) == ("kv_transfer", False)
    assert abs(check.recovered_ms) < 1.0
    assert not result.ok
