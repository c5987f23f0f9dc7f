"""The load generator stopped mid-run (its task cancelled, as Ctrl-C does inside
``asyncio.run``): the request in flight ends ``cancelled`` with its client span written, the
requests waiting for a slot are never sent and leave nothing. Against an asyncio SSE server
on loopback that answers the first request and holds the second open."""

from __future__ import annotations

import asyncio
import json

from ttft.collectors import TraceWriter, read_spans
from ttft.collectors.loadgen import CANCELLED_ERROR, run
from ttft.collectors.workloads import WorkItem
from ttft.tracer.schema import OUTCOME_CANCELLED

TIMEOUT_S = 30.0
SSE = (b'data: {"id":"cmpl-0","choices":[{"index":0,"text":"Hi","finish_reason":"stop"}]}'
       b"\n\ndata: [DONE]\n\n")


async def serve(held: asyncio.Event, traces: list[str]) -> asyncio.Server:
    """Answer the first completion, hold every later one open until its client goes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                headers = {k.lower(): v for k, v in headers.items()}
                await reader.readexactly(int(headers.get("content-length", "0")))
                traces.append(headers["traceparent"].split("-")[1])
                if len(traces) > 1:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n")
                    await writer.drain()
                    held.set()
                    await reader.read()  # until the client closes
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(SSE), SSE))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_a_stopped_run_cancels_the_request_in_flight_and_keeps_its_client_span(tmp_path):
    out = tmp_path / "run.parquet"
    ended: list[str] = []
    sent: list[int] = []

    async def main() -> list[str]:
        held, traces = asyncio.Event(), []
        server = await serve(held, traces)
        port = server.sockets[0].getsockname()[1]
        work = [WorkItem(0.0, f"prompt {i}", 1) for i in range(4)]
        writer = TraceWriter(out)
        load = asyncio.create_task(run(
            f"http://127.0.0.1:{port}", work, concurrency=1, writer=writer,
            timeout_s=TIMEOUT_S, on_sent=sent.append,
            on_result=lambda r: ended.append(r.outcome)))
        await asyncio.wait_for(held.wait(), TIMEOUT_S)
        load.cancel()
        try:
            await load
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the load generator swallowed its cancellation")
        writer.close()
        server.close()
        await server.wait_closed()
        return traces

    traces = asyncio.run(main())
    assert len(traces) == 2 and sent == [0, 1]  # two of four were sent, one at a time
    assert ended == ["ok"]  # the cancelled one is not passed to on_result
    table = read_spans(out)
    clients = [r for r in table.to_pylist() if r["stage"] == "client"]
    by_trace = {r["trace_id"]: json.loads(r["attributes"]) for r in clients}
    assert list(by_trace) == traces  # in the order they ended; the waiting two left nothing
    assert [by_trace[t]["outcome"] for t in traces] == ["ok", OUTCOME_CANCELLED]
    assert by_trace[traces[1]]["error"] == CANCELLED_ERROR
    assert by_trace[traces[1]]["status_code"] == 200  # the headers came before the stop
    held_rows = [r for r in table.to_pylist() if r["trace_id"] == traces[1]]
    (span,) = [r for r in held_rows if r["stage"] == "client"]
    names = [r["name"] for r in held_rows if r["stage"] == "event"]
    assert "headers" in names and "first_token" not in names
    assert span["end_ns"] >= max(r["end_ns"] for r in held_rows)
