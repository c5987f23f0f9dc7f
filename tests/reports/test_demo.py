"""`ttft demo` end to end, small: the in-process server, the load generator, one trace."""

from __future__ import annotations

from ttft.reports.runs.demo import run_demo


def test_demo_traces_client_and_server_into_one_analyzable_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("TTFT_CACHE_DIR", str(tmp_path / "cache"))
    result = run_demo(tmp_path / "demo", requests=8, model="tiny", rate_per_s=50.0)
    assert (result.requests, result.errors) == (8, 0)
    summary = result.summary.to_dict()
    assert summary["boundary"] == "client" and summary["requests"] == 8
    stages = summary["stages"]
    for stage in ("network", "server", "queue", "prefill.chunk", "tokenize"):
        assert stage in stages, stage
    assert abs(sum(s["share"] for s in stages.values()) - 1.0) < 1e-9
    # the warm-up went out "not sampled", but the engine's steps that ran it are still
    # traced: they form one windowless group, counted rather than guessed
    assert summary["quality"]["no_window"] == 1
    assert result.trace.exists()
