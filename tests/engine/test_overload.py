"""The reference server under overload and under clients that go away, over real loopback
sockets (uvicorn in a thread of this process, the tiny model on CPU).

- Overload: open-loop Poisson arrivals at 10x the measured sustainable rate. Every request
  is answered 200 or 429 with ``Retry-After``; admitted requests' TTFT stays bounded by what
  the waiting queue allows; the server's memory stays bounded; no K/V block stays held by a
  request once the load stops.
- Disconnects: streaming clients abort before their first token or after a few tokens;
  every request's K/V is released, the server logs no error, counts the cancellations and
  still serves.

The short versions run by default, the full ones with ``pytest -m stress``.

The load generator runs in a child process (``spawn``): a client in this process would
take the GIL from the server's event loop and engine at hundreds of requests/s, so the test
would overload its own client, and this process's RSS would count the client's memory.
The tests import the engine (and torch) themselves, so the child, which imports this
module, does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import random
import socket
import struct
import threading
import time
from collections import Counter

import httpx
import numpy as np
import pytest
from _live import wait_until
from prometheus_client.parser import text_string_to_metric_families

MODEL = "ttft-tiny"
WAIT_S = 30.0  # the longest any single wait of these tests may take
PROMPT = "Once upon a time there was a little dog who ran across the green field and"


def rss_bytes() -> int:
    """This process's resident set size now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def requests_total(url: str) -> Counter:
    """``ttft:requests_total`` by ``status`` from the server's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=WAIT_S).text
    out: Counter = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "ttft:requests_total":
                out[s.labels["status"]] = int(s.value)
    return out


def engine_idle(engine) -> bool:
    return engine.num_running == 0 and engine.num_waiting == 0 and engine.cache.blocks_in_use() == 0


def assert_no_leaked_blocks(engine) -> None:
    """Every K/V block is free or held by the prefix cache alone, one reference each.

    ``blocks_in_use()`` counts blocks a live request references; the prefix cache may keep
    finished requests' full blocks (``blocks_cached()``) until evicted, which is not a leak.
    So "back to zero" is: no request holds a block, and the free list plus the prefix
    cache's blocks account for every block, the cache holding exactly one reference on each.
    """
    cache = engine.cache
    assert cache.blocks_in_use() == 0
    assert cache.blocks_cached() == len(engine.prefix_cache)
    assert cache.allocator.num_free + cache.blocks_cached() == cache.num_blocks
    assert all(r in (0, 1) for r in cache.allocator.ref_counts)


class LogTrap:
    """``caplog`` at WARNING on the root logger and on ``uvicorn`` (which does not propagate
    to the root, so its "Exception in ASGI application" would otherwise go unseen)."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        self.uvicorn = logging.getLogger("uvicorn")

    def __enter__(self) -> LogTrap:
        self.caplog.set_level(logging.WARNING)
        self.caplog.clear()
        self.uvicorn.addHandler(self.caplog.handler)
        return self

    def __exit__(self, *exc: object) -> None:
        self.uvicorn.removeHandler(self.caplog.handler)

    def crashes(self) -> list[str]:
        """Records at ERROR or above, or carrying a traceback."""
        return [
            f"{r.name} {r.levelname}: {r.getMessage()}"
            for r in self.caplog.records
            if r.levelno >= logging.ERROR or r.exc_info or r.exc_text
        ]


# -- overload --------------------------------------------------------------------------


def completion_body(i: int, max_tokens: int, repeats: int = 1) -> dict:
    """A streamed completion whose prompt is ``PROMPT`` ``repeats`` times (17 tokens each)
    and a suffix of its own: a shared prefix, so the prefix cache keeps blocks of finished
    requests and hands them to later ones."""
    return {
        "model": MODEL,
        "prompt": " ".join([PROMPT] * repeats) + f" then request {i} said",
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
    }


async def closed_loop(url: str, concurrency: int, duration_s: float, max_tokens: int):
    """(requests completed, seconds) with ``concurrency`` streaming requests always in
    flight for ``duration_s``."""
    done = 0
    deadline = time.perf_counter() + duration_s
    async with httpx.AsyncClient(timeout=WAIT_S) as http:

        async def worker(w: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                body = completion_body(w, max_tokens)
                async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_lines():
                        pass
                done += 1

        t0 = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(worker(w) for w in range(concurrency))), duration_s + WAIT_S
        )
        return done, time.perf_counter() - t0


async def one_request(http: httpx.AsyncClient, url: str, body: dict) -> dict:
    """One streamed completion: status, ``Retry-After``, error code, TTFT (request handed
    to the client -> first chunk with text), whether the stream ended with ``[DONE]``."""
    t0 = time.perf_counter()
    out: dict = {"status": None, "retry_after": None, "code": None, "ttft_s": None, "done": False}
    async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            out["retry_after"] = r.headers.get("retry-after")
            out["code"] = json.loads(await r.aread())["error"]["code"]
            return out
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                out["done"] = True
            elif line.startswith("data: ") and out["ttft_s"] is None:
                if json.loads(line[6:])["choices"][0]["text"]:
                    out["ttft_s"] = time.perf_counter() - t0
    return out


async def open_loop(url: str, arrivals_s: list[float], max_tokens: int, timeout_s: float):
    """Send request ``i`` at ``arrivals_s[i]`` after the start, whatever is in flight."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)

    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as http:

        async def bounded(i: int) -> dict:
            try:
                return await asyncio.wait_for(
                    one_request(http, url, completion_body(i, max_tokens)), timeout_s
                )
            except (httpx.HTTPError, TimeoutError, ValueError, KeyError) as e:
                return {"status": type(e).__name__}

        tasks, lag_s = [], []
        t0 = time.perf_counter()
        for i, due_s in enumerate(arrivals_s):
            delay_s = t0 + due_s - time.perf_counter()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            lag_s.append(time.perf_counter() - t0 - due_s)
            tasks.append(asyncio.create_task(bounded(i)))
        sent_s = time.perf_counter() - t0
        results = await asyncio.gather(*tasks)
    return {"results": results, "sent_s": sent_s, "lag_s": lag_s}


def load_child(conn) -> None:
    """The child process: say it is ready, receive (url, arrivals, max_tokens, timeout),
    send the results."""
    try:
        conn.send("ready")
        if not conn.poll(WAIT_S * 4):
            return
        url, arrivals_s, max_tokens, timeout_s = conn.recv()
    except (EOFError, OSError):  # the test ended before it had a load to send
        return
    conn.send(asyncio.run(open_loop(url, arrivals_s, max_tokens, timeout_s)))
    conn.close()


class RssPeak:
    """The RSS of this process, sampled every 50 ms in a thread: the highest, and the
    samples with their time since entering (for the growth over the later half)."""

    def __init__(self) -> None:
        self.peak = rss_bytes()
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            rss = rss_bytes()
            self.samples.append((time.monotonic() - self._t0, rss))
            self.peak = max(self.peak, rss)

    def later_growth(self, from_s: float) -> int:
        """The highest RSS after ``from_s`` minus the RSS at ``from_s``."""
        later = [rss for t_s, rss in self.samples if t_s >= from_s]
        return max(later) - later[0] if later else 0

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        self.peak = max(self.peak, rss_bytes())


# The engine under overload. The tiny model on CPU serves a request in ~10 ms, so at 10x
# its rate (~800/s; still ~200/s with a 40 ms cost per admission) the HTTP side of this one
# process (uvicorn and FastAPI, ~1 ms of Python per request, sharing the GIL with the
# engine and two shared cores with the load generator) is the bottleneck: requests then
# wait seconds before the endpoint sees them, where no max_queue bounds anything. A known
# cost per admission (the server's documented ``inject_delay_ms``: ``schedule`` sleeps in
# the worker once per admitted request, using no CPU) makes the engine the bottleneck, as
# the model is in real serving; 10x its rate is then well within the HTTP side's reach.
SCHEDULE_MS = 100
MAX_QUEUE = 8
MAX_TOKENS = 8
TTFT_FACTOR = 2.0
RSS_GROWTH_BOUND = 32 * 2**20
"""Peak RSS growth over the whole load: allocator and thread warm-up, which depends on what
the process ran before (1.4 MiB alone, 10 MiB after the other stress tests)."""
RSS_LATER_GROWTH_BOUND = 4 * 2**20
"""RSS growth over the second half of the load, once warm: a leak of 5 kB per request
crosses it in the full run (about 880 requests in that half)."""


@pytest.mark.parametrize(
    "load_s",
    [pytest.param(3.0, id="short"), pytest.param(20.0, id="full", marks=pytest.mark.stress)],
)
def test_overload_sheds_with_429_and_keeps_admitted_ttft_bounded(load_s, caplog):
    ctx = multiprocessing.get_context("spawn")
    parent, child_end = ctx.Pipe()
    child = ctx.Process(target=load_child, args=(child_end,), daemon=True)
    child.start()  # imports while this process imports torch and builds the engine
    try:
        from ttft.engine.server import build_engine, serving

        engine = build_engine(
            "tiny",
            device="cpu",
            seed=0,
            max_queue=MAX_QUEUE,
            inject_delay_ms={"schedule": SCHEDULE_MS},
        )
        max_running = engine.config.max_running
        with serving(engine, model_name=MODEL) as url, LogTrap(caplog) as logs:
            # Sustainable rate: the closed-loop throughput with MAX_QUEUE requests in flight,
            # the most that can never be refused (at most that many wait). The rate levels
            # off there: admissions run back to back (~9/s; with one in flight ~7/s, as the
            # request's decode steps then sit between admissions). After one warm-up request.
            # The child has imported what it needs: it takes no CPU from the measurement.
            assert parent.poll(WAIT_S) and parent.recv() == "ready"
            httpx.post(f"{url}/v1/completions", json=completion_body(-1, 1), timeout=WAIT_S)
            done, elapsed_s = asyncio.run(closed_loop(url, MAX_QUEUE, 1.5, MAX_TOKENS))
            rate_per_s = done / elapsed_s
            service_s = 1.0 / rate_per_s  # the server's time per request at that rate
            rng = random.Random(1)
            arrivals_s, t_s = [], rng.expovariate(10 * rate_per_s)
            while t_s < load_s:
                arrivals_s.append(t_s)
                t_s += rng.expovariate(10 * rate_per_s)
            timeout_s = 2 * WAIT_S  # per request; admitted ones take ~1-2 s
            before = requests_total(url)
            rss0 = rss_bytes()
            with RssPeak() as rss:
                parent.send((url, arrivals_s, MAX_TOKENS, timeout_s))
                assert parent.poll(load_s + timeout_s + WAIT_S), "load generator hung"
                load = parent.recv()
            results = load["results"]

            # The server survived and still serves.
            assert httpx.get(f"{url}/health", timeout=WAIT_S).status_code == 200
            assert wait_until(lambda: engine_idle(engine), WAIT_S), (
                engine.num_running,
                engine.num_waiting,
                engine.cache.blocks_in_use(),
            )
            assert_no_leaked_blocks(engine)

            statuses = Counter(r["status"] for r in results)
            ok = [r for r in results if r["status"] == 200]
            shed = [r for r in results if r["status"] == 429]
            # Every request was answered, 200 or 429: no timeout, reset or 5xx.
            assert statuses[200] + statuses[429] == len(arrivals_s), statuses
            assert all(r["done"] and r["ttft_s"] is not None for r in ok)
            assert all(r["code"] == "queue_full" for r in shed)
            assert all((r["retry_after"] or "").isdigit() for r in shed)
            assert all(int(r["retry_after"]) > 0 for r in shed)
            # The server's own counts agree with the client's, exactly.
            after = requests_total(url)
            assert after["ok"] - before["ok"] == statuses[200]
            assert after["queue_full"] - before["queue_full"] == statuses[429]
            assert after["cancelled"] == before["cancelled"]
            assert after["error"] == before["error"] == 0
            # It was overload: most arrivals were shed.
            share_429 = statuses[429] / len(arrivals_s)
            assert share_429 > 0.5

            # Ahead of an admitted request are at most MAX_QUEUE requests waiting (those
            # before it, or an admission pass already under way) and max_running running.
            # Admission is FCFS and each of them takes the server about service_s (measured
            # above, the per-admission cost included), so its first token comes within
            # (MAX_QUEUE + max_running) x service_s; the factor 2 covers the CPU that the
            # 429s and the HTTP side take from the engine under overload (the sustainable
            # rate was measured without them).
            ttft_p99_s = float(np.percentile([r["ttft_s"] for r in ok], 99))
            bound_s = (MAX_QUEUE + max_running) * service_s * TTFT_FACTOR
            assert ttft_p99_s <= bound_s

            # Memory: the waiting queue is bounded and a refused request leaves nothing
            # behind, so the server's RSS may grow by allocator warm-up, not per request (a
            # leak of 5 kB per request would cross the bound in the full run, ~1,700 of them).
            growth = rss.peak - rss0
            assert growth <= RSS_GROWTH_BOUND
            later_growth = rss.later_growth(load_s / 2)
            assert later_growth <= RSS_LATER_GROWTH_BOUND
            assert logs.crashes() == []
            print(
                f"\noverload {load_s:.0f} s: sustainable {rate_per_s:.1f}/s "
                f"(service {service_s * 1e3:.1f} ms), offered {len(arrivals_s)} requests "
                f"at {10 * rate_per_s:.0f}/s, sent in {load['sent_s']:.2f} s "
                f"(lag p99 {np.percentile(load['lag_s'], 99) * 1e3:.0f} ms); "
                f"200: {statuses[200]}, 429: {statuses[429]} ({share_429:.1%}); "
                f"admitted TTFT p50 {np.percentile([r['ttft_s'] for r in ok], 50) * 1e3:.0f} "
                f"ms, p99 {ttft_p99_s * 1e3:.0f} ms (bound {bound_s * 1e3:.0f} ms); "
                f"RSS growth {growth / 2**20:.1f} MiB ({later_growth / 2**20:.1f} MiB in the "
                "second half)"
            )
    finally:
        parent.close()
        child.join(WAIT_S)
        if child.is_alive():
            child.kill()
            child.join(WAIT_S)


# -- disconnects -----------------------------------------------------------------------

ABORT_MAX_TOKENS = 200  # far more than any client waits for: no stream ends on its own


def raw_request(port: int, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def aborting_client(port: int, request: bytes, tokens: int, reset: bool, delay_s: float):
    """Send one streamed request on a new connection, then go away: right after sending
    (``tokens == 0``) or once ``tokens`` chunks with text came; with a TCP reset
    (``SO_LINGER`` 0) or an orderly close.

    Returns:
        ``"before_first_token"``, ``"mid_stream"`` (left while the stream was still open)
        or ``"finished"`` (the stream ended before ``tokens`` chunks).
    """
    await asyncio.sleep(delay_s)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        if tokens == 0:
            return "before_first_token"
        status = await reader.readline()
        assert status.startswith(b"HTTP/1.1 200 "), status
        seen = 0
        while seen < tokens:
            line = await reader.readline()
            if not line or line.startswith(b"data: [DONE]"):
                return "finished"
            if line.startswith(b"data: {"):
                choice = json.loads(line[6:])["choices"][0]
                if choice["finish_reason"] is not None:
                    return "finished"
                seen += bool(choice["text"])
        return "mid_stream"
    finally:
        if reset:
            writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
        writer.close()
        with contextlib.suppress(OSError):
            await asyncio.wait_for(writer.wait_closed(), WAIT_S)


@pytest.mark.parametrize(
    "n_clients",
    [pytest.param(40, id="short"), pytest.param(200, id="full", marks=pytest.mark.stress)],
)
def test_clients_that_go_away_release_their_kv_blocks(n_clients, caplog, collect):
    from ttft.engine.server import build_engine, serving

    # Traced, as ``ttft serve`` is (cut prefills and cancelled waits record their spans);
    # a queue that takes every client: the aborts, not 429s, are under test.
    exporter, tracing = collect
    engine = build_engine("tiny", device="cpu", seed=0, max_queue=n_clients, measure_peaks=False)
    rng = random.Random(7)
    # Per client: tokens before going away (0: right after sending), reset or close, when
    # it starts, and its prompt's length: up to ~290 tokens, so some prefills take two
    # chunks (chunk_size 256) and are cut between them.
    plan = []
    for _ in range(n_clients):
        tokens = 0 if rng.random() < 0.3 else rng.randint(1, 8)
        plan.append((tokens, rng.random() < 0.5, rng.uniform(0.0, 1.0), rng.randint(1, 17)))

    with serving(engine, model_name=MODEL) as url, LogTrap(caplog) as logs:
        port = int(url.rsplit(":", 1)[1])
        before = requests_total(url)

        async def run_clients():
            clients = (
                aborting_client(
                    port,
                    raw_request(port, completion_body(i, ABORT_MAX_TOKENS, repeats)),
                    tokens,
                    reset,
                    delay_s,
                )
                for i, (tokens, reset, delay_s, repeats) in enumerate(plan)
            )
            return await asyncio.wait_for(asyncio.gather(*clients), WAIT_S * 2)

        outcomes = Counter(asyncio.run(run_clients()))
        n_before = sum(1 for tokens, *_ in plan if tokens == 0)
        assert outcomes["before_first_token"] == n_before
        assert outcomes["mid_stream"] + outcomes["finished"] == n_clients - n_before

        # No request keeps a K/V block once its client is gone.
        assert wait_until(lambda: engine_idle(engine), WAIT_S), (
            engine.num_running,
            engine.num_waiting,
            engine.cache.blocks_in_use(),
        )
        assert_no_leaked_blocks(engine)

        # A client that saw a token was admitted and its stream was still open when it
        # left: the server saw that request go away, so it counts as cancelled. One that
        # left right after sending may be gone before the endpoint read its body (then the
        # server counts nothing) or after (cancelled); none of them may run to completion.
        after = requests_total(url)
        cancelled = after["cancelled"] - before["cancelled"]
        assert outcomes["mid_stream"] <= cancelled <= outcomes["mid_stream"] + n_before
        assert after["ok"] - before["ok"] == outcomes["finished"]
        assert after["error"] == before["error"] == 0

        # ... and the server still serves.
        r = httpx.post(
            f"{url}/v1/completions", json={**completion_body(0, 8), "stream": False}, timeout=WAIT_S
        )
        assert r.status_code == 200
        usage = r.json()["usage"]
        assert 1 <= usage["completion_tokens"] <= 8
        assert wait_until(lambda: engine_idle(engine), WAIT_S)

        # The engine closed every request it was handed with exactly one ``queue`` span
        # (admitted, or cancelled while waiting): the cancelled ones and the last one.
        flushed = tracing.flush(WAIT_S)
        assert flushed.dropped == flushed.failed == 0
        queued = Counter(
            sp.attributes["ttft.request_id"] for sp in exporter.spans if sp.name == "queue"
        )
        assert set(queued.values()) == {1}
        assert len(queued) == cancelled + outcomes["finished"] + 1
        # ... and stopped computing for a client once it was gone: a request the client
        # left after at most 8 tokens was in far fewer steps than running to max_tokens
        # (ABORT_MAX_TOKENS - 1 decode steps) takes.
        steps = Counter(
            rid
            for sp in exporter.spans
            if sp.name == "step"
            for rid in sp.attributes["request_ids"]
        )
        assert max(steps.values()) < ABORT_MAX_TOKENS // 2
        assert logs.crashes() == []
        print(
            f"\ndisconnects: {n_clients} clients, {n_before} before the first token, "
            f"{outcomes['mid_stream']} mid-stream, {outcomes['finished']} finished first; "
            f"cancelled counted {cancelled}; most steps of one request {max(steps.values())}; "
            f"warnings logged {len(logs.caplog.records)}"
        )
