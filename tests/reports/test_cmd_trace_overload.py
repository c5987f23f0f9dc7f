"""`ttft trace` says when the server did not keep up with the offered rate: a small
Starlette server over loopback that serves one request at a time, so its capacity is known,
traced once above it (one yellow line: offered against achieved) and once well below it (no
such line)."""

from __future__ import annotations

import asyncio

from _live import running, sse, stand_in_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from typer.testing import CliRunner

from ttft.reports.cli import app

runner = CliRunner()

SERVICE_S = 0.1
"""Each request holds the server alone for this long: its capacity is 10 requests/s."""


def serial_server() -> Starlette:
    one_at_a_time = asyncio.Lock()

    async def completions(request: Request) -> Response:
        body = await request.json()
        async with one_at_a_time:
            await asyncio.sleep(SERVICE_S)

        async def chunks():
            for i in range(body["max_tokens"]):
                last = i == body["max_tokens"] - 1
                yield sse({"id": "cmpl-1", "choices": [
                    {"index": 0, "text": f" w{i}", "finish_reason": "length" if last else None}]})
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return stand_in_app("completions", completions)


def trace(url: str, out, rate: float, requests: int):
    return runner.invoke(app, [
        "trace", url, "--rate", str(rate), "--arrival", "constant", "--requests",
        str(requests), "--prompt-tokens", "8:12", "--output-tokens", "2", "--receiver-port",
        "0", "--span-wait", "0", "--seed", "1", "-o", str(out)])


def _achieved(output: str) -> float:
    line = next(line for line in output.splitlines() if line.startswith("achieved rate: "))
    return float(line.split()[2])


def test_a_rate_above_the_servers_capacity_prints_one_overload_line(tmp_path):
    with running(serial_server()) as url:
        result = trace(url, tmp_path / "run.parquet", rate=50, requests=20)
    assert result.exit_code == 0, result.output
    # 20 arrivals 20 ms apart; the server completes one per 100 ms (less on a busy machine)
    achieved = _achieved(result.output)
    assert 2.0 < achieved < 12.0, result.output
    assert ("the schedule offered 50.00 requests/s)" in result.output
            and "20 of 20 completed in " in result.output)
    warnings = [line for line in result.output.splitlines() if "did not keep up" in line]
    assert warnings == [
        f"the server did not keep up: offered 50.00 requests/s, achieved {achieved:.2f} "
        "requests/s (under 85% of it), so TTFT includes queueing from overload; lower --rate "
        "to see it unloaded"]


def test_a_rate_well_below_capacity_prints_no_overload_line(tmp_path):
    with running(serial_server()) as url:
        result = trace(url, tmp_path / "run.parquet", rate=3, requests=8)
    assert result.exit_code == 0, result.output
    # completions follow the arrivals, 333 ms apart: the latency (100 ms) cancels
    achieved = _achieved(result.output)
    assert 2.55 < achieved < 3.6, result.output
    assert "the schedule offered 3.00 requests/s)" in result.output
    assert "did not keep up" not in result.output


def test_a_closed_loop_offers_no_rate_and_gets_no_overload_line(tmp_path):
    with running(serial_server()) as url:
        result = runner.invoke(app, [
            "trace", url, "--concurrency", "4", "--requests", "8", "--prompt-tokens", "8:12",
            "--output-tokens", "2", "--receiver-port", "0", "--span-wait", "0",
            "-o", str(tmp_path / "run.parquet")])
    assert result.exit_code == 0, result.output
    assert "closed loop or burst: no offered rate)" in result.output
    assert 4.0 < _achieved(result.output) < 12.0  # one per 100 ms, whatever is in flight
    assert "did not keep up" not in result.output
