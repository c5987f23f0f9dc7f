"""Run guidellm 0.8.1 as a load-generating client and read back its per-request timings.

    python benchmarks/_guidellm_client.py GUIDELLM URL (--concurrency N | --rate R [--poisson])
        [--requests 100] [--max-tokens 8] [--prompt TEXT] [--workdir DIR] [--workers N]
        [--timeout 300]

prints how many records guidellm wrote and their TTFT p50/p90 (exit status 1 unless all
``--requests`` succeeded).

A benchmark that compares a client's own time to first token (TTFT) with a packet capture
needs the client's per-request numbers, not its summary. :func:`run_guidellm` runs the
``guidellm`` executable (its own virtual environment; nothing of guidellm is imported here)
against an OpenAI-compatible streaming server, offline, and parses the JSON report it writes.

How guidellm 0.8.1 is driven (read from its installed source, ``guidellm/...`` below is
``<site-packages>/guidellm/...``):

- ``guidellm run`` takes each option (``--backend``, ``--data``, ``--profile``,
  ``--constraint``, ``--output``) as a ``key=value,...`` string *or* a JSON/YAML object
  (``guidellm/utils/cli.py`` ``parse_arguments``: ``yaml.safe_load`` first). JSON is used
  here, so URLs and paths need no escaping.
- Backend ``openai_http`` (``guidellm/schemas/backends/openai_http.py``):
  ``request_format="/v1/completions"`` (the legacy endpoint; the default is chat),
  ``stream=true``, ``max_tokens`` (sent as the body's ``max_tokens``; a data column
  ``output_tokens_count`` would override it and add ``ignore_eos``, so none is written),
  ``model`` set explicitly (otherwise guidellm GETs ``/v1/models``),
  ``validate_backend=false`` (otherwise it GETs ``/health`` first and fails on a server that
  lacks it) and ``http2=false`` (plain HTTP/1.1; httpx would not use h2 without TLS anyway).
- Data: a ``.jsonl`` file written into ``workdir`` with one ``{"prompt": ...}`` row per
  request (kind ``json_file``; the ``prompt`` column is the generative column mapper's first
  text column). The run ends when either the rows or the ``max_requests`` constraint run out,
  so both equal ``requests``.
- Tokenizer: none is loaded. guidellm always builds a ``huggingface_auto`` tokenizer factory
  named after the model (``guidellm/benchmark/entrypoints.py`` ``resolve_tokenizer``), but
  it is lazy (``guidellm/data/tokenizers/huggingface.py``: ``AutoTokenizer.from_pretrained``
  only runs when the factory is called) and the file deserializers and the generative
  finalizer never call it; prompt token counts come from the server's ``usage`` chunk.
  ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``/``TRANSFORMERS_OFFLINE`` are set anyway, and
  ``HF_HOME`` points into ``workdir`` (``datasets.load_dataset("json", ...)`` writes a cache).
- Profile: ``{"kind": "concurrent", "streams": N}`` (closed loop) or
  ``{"kind": "constant"|"poisson", "rate": R}`` (open loop); no warm-up or cool-down (their
  defaults are empty), so every request is in the report.
- Output: ``{"kind": "json", "path": ...}``. The report is
  ``{"metadata", "config", "benchmarks": [...], "conclusions"}``; the one benchmark's
  per-request records are ``benchmarks[0]["requests"]["successful" | "errored" |
  "incomplete"]``, each a ``GenerativeRequestStats``
  (``guidellm/schemas/base/request_stats.py``) with ``info.timings`` (a ``RequestTimings``,
  ``guidellm/schemas/base/info.py``) and computed fields such as ``time_to_first_token_ms``.
  All are kept (``--metrics`` ``sample_size`` defaults to ``None``: keep everything).

What the timing fields mean (``guidellm/backends/openai/http.py``, ``_resolve_streaming``,
run in a guidellm worker process; every timestamp is ``time.time()``, i.e. Unix epoch seconds
on ``CLOCK_REALTIME``, not a monotonic clock):

- ``info.timings.request_start`` (our ``start_s``): first set to ``time.time()`` just before
  ``httpx.AsyncClient.stream(...)`` is entered (line 349), then *overwritten* by the httpx
  ``trace`` extension ``_trace_request_start`` (lines 418-434) with ``time.time()`` (line 432)
  taken on httpcore's ``http11.send_request_headers.started`` event: after a pooled connection
  was obtained (and, for a new connection, after the TCP connect), immediately before the
  request headers are serialised and written to the socket. So it excludes connection set-up
  and precedes the write of the request's first byte; the body is written after it. (Where
  the headers are never written, e.g. the connection is refused, the first value stays.)
- ``info.timings.first_token_iteration`` (our ``first_token_s``): ``time.time()`` taken
  (line 360, ``iter_time``) when ``httpx.Response.aiter_lines()`` has yielded a non-blank SSE
  line whose ``choices[0].text`` is non-empty (``TextCompletionsRequestHandler
  .add_streaming_line`` returns 1; line 379 records it the first time). It is taken after
  the bytes were read from the socket, decoded and split into lines, in the worker's asyncio
  loop, so it includes client-side read/scheduling delay. (``first_request_iteration`` is the
  same for the first non-blank line of any kind.)
- ``time_to_first_token_ms`` (our ``ttft_ms``): guidellm's own TTFT,
  ``1000 * (first_token_iteration - request_start)``
  (``guidellm/schemas/base/request_stats.py`` lines 262-273, the ``return`` at 273); it is
  what guidellm's console "TTFT ms" summarises. It uses the client's timestamps only
  (server-reported ``metrics`` do not enter it).

Caveats seen with guidellm 0.8.1:

- ``poisson`` with more than one worker process does not keep its schedule.
  ``AsyncPoissonStrategy.init_processes_start`` (``guidellm/scheduler/strategies.py``
  lines 661-678) sets the start event (via ``ThroughputStrategy.init_processes_start``)
  *before* it sets the shared arrival offset to the start time, so workers that wake at once
  add their delays to the initial ``-1.0`` and target times about one second before the epoch,
  i.e. in the past: those requests go out at once, as a burst (a 50-request run at 50/s took
  0.2 s, ``targeted_start`` values near -1..5). Every worker also draws from its own
  ``random.Random(42)``, so the gap sequence repeats per worker. With
  ``max_worker_processes=1`` the targets were right. ``constant`` was right either way.
- guidellm starts up to 10 worker processes (``min(streams, 10)`` for ``concurrent``, 10 for
  ``constant``/``poisson``). On a machine with few cores they contend with each other and the
  server, which shows up in guidellm's TTFT (see ``max_worker_processes``).

guidellm sends no ``traceparent`` header, so a server log (such as benchmarks/sse_server.py's)
cannot be joined to these records by trace id; join by time instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

__all__ = ["GuidellmRequest", "build_command", "parse_report", "run_guidellm"]

#: The report's per-request groups, and whether a request in each counts as ``ok``.
_GROUPS: tuple[tuple[str, bool], ...] = (
    ("successful", True),
    ("errored", False),
    ("incomplete", False),
)


@dataclass(frozen=True)
class GuidellmRequest:
    """One request as guidellm recorded it (see the module docstring for each field's origin).

    Times are Unix epoch seconds from ``time.time()`` in the guidellm worker process; a value
    guidellm did not record (an errored request that never got a token) is ``math.nan``.
    """

    #: ``info.timings.request_start``: just before the request headers are written.
    start_s: float
    #: ``info.timings.first_token_iteration``: the first SSE line with text was read.
    first_token_s: float
    #: ``time_to_first_token_ms``: guidellm's TTFT, ``1000 * (first_token_s - start_s)``.
    ttft_ms: float
    #: Whether guidellm filed the request under ``successful`` (not errored or incomplete).
    ok: bool


def _num(value: Any) -> float:
    """``value`` as a float, or ``math.nan`` where guidellm left it out (``None``)."""
    return math.nan if value is None else float(value)


def build_command(
    guidellm: str,
    base_url: str,
    *,
    data_path: pathlib.Path,
    output_path: pathlib.Path,
    concurrency: int | None = None,
    rate: float | None = None,
    rate_profile: str = "constant",
    requests: int = 100,
    max_tokens: int = 8,
    model: str = "sse-test",
    request_timeout_s: float = 300.0,
) -> list[str]:
    """The ``guidellm run`` argument list :func:`run_guidellm` executes.

    :param guidellm: path of the ``guidellm`` executable.
    :param base_url: server root, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is
        stripped by guidellm itself).
    :param data_path: the ``.jsonl`` prompt file (one ``{"prompt": ...}`` row per request).
    :param output_path: where guidellm writes its JSON report.
    :param concurrency: streams of the ``concurrent`` profile; exclusive with ``rate``.
    :param rate: requests/s of the ``constant`` or ``poisson`` profile.
    :param rate_profile: ``"constant"`` or ``"poisson"`` (used with ``rate`` only).
    :param requests: the ``max_requests`` constraint.
    :param max_tokens: the body's ``max_tokens``.
    :param model: the body's ``model`` (also names the never-loaded tokenizer).
    :param request_timeout_s: httpx read timeout for each request.
    :raises ValueError: on an invalid combination of arguments.
    """
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency and rate")
    if requests < 1 or max_tokens < 1:
        raise ValueError("requests and max_tokens must be positive")
    profile: dict[str, Any]
    if concurrency is not None:
        if concurrency < 1:
            raise ValueError("concurrency must be positive")
        profile = {"kind": "concurrent", "streams": int(concurrency)}
    else:
        assert rate is not None
        if rate_profile not in ("constant", "poisson"):
            raise ValueError("rate_profile must be 'constant' or 'poisson'")
        if not rate > 0:
            raise ValueError("rate must be positive")
        profile = {"kind": rate_profile, "rate": float(rate)}
    backend = {
        "kind": "openai_http",
        "target": base_url,
        "model": model,
        "request_format": "/v1/completions",
        "stream": True,
        "max_tokens": int(max_tokens),
        "validate_backend": False,
        "http2": False,
        "timeout": float(request_timeout_s),
    }

    def js(obj: dict[str, Any]) -> str:
        return json.dumps(obj, separators=(",", ":"))

    return [
        guidellm,
        "run",
        "--backend",
        js(backend),
        "--data",
        js({"kind": "json_file", "path": str(data_path)}),
        "--profile",
        js(profile),
        "--constraint",
        js({"kind": "max_requests", "count": int(requests)}),
        "--output",
        js({"kind": "json", "path": str(output_path)}),
        "--disable-console",
    ]


def parse_report(report: dict[str, Any]) -> list[GuidellmRequest]:
    """The per-request records of a guidellm 0.8.1 JSON report, ordered by ``start_s``.

    Reads ``benchmarks[*]["requests"]["successful" | "errored" | "incomplete"]``.
    """
    out: list[GuidellmRequest] = []
    for bench in report.get("benchmarks", []):
        groups = bench.get("requests") or {}
        for group, ok in _GROUPS:
            for rec in groups.get(group) or []:
                timings = rec.get("info", {}).get("timings", {})
                out.append(
                    GuidellmRequest(
                        start_s=_num(timings.get("request_start")),
                        first_token_s=_num(timings.get("first_token_iteration")),
                        ttft_ms=_num(rec.get("time_to_first_token_ms")),
                        ok=ok,
                    )
                )
    out.sort(key=lambda r: (math.isnan(r.start_s), r.start_s))
    return out


def _env(workdir: pathlib.Path, max_worker_processes: int | None = None) -> dict[str, str]:
    """guidellm's environment: offline, caches in ``workdir``, no inherited ``GUIDELLM__``
    settings (only ``GUIDELLM__MAX_WORKER_PROCESSES`` where ``max_worker_processes`` is given).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUIDELLM__")}
    if max_worker_processes is not None:
        if max_worker_processes < 1:
            raise ValueError("max_worker_processes must be positive")
        env["GUIDELLM__MAX_WORKER_PROCESSES"] = str(int(max_worker_processes))
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(workdir / "hf_home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_COLOR="1",
    )
    return env


def run_guidellm(
    guidellm: str,
    base_url: str,
    *,
    concurrency: int | None = None,
    rate: float | None = None,
    requests: int = 100,
    prompt: str = "Say hello.",
    max_tokens: int = 8,
    workdir: pathlib.Path,
    timeout_s: float = 300.0,
    rate_profile: str = "constant",
    max_worker_processes: int | None = None,
    model: str = "sse-test",
) -> list[GuidellmRequest]:
    """Exactly one of concurrency (closed loop, guidellm's 'concurrent' profile) or rate
    (open loop, 'constant' or 'poisson' profile at that many requests/s).

    Runs ``guidellm run`` (see :func:`build_command` for the exact arguments) against the
    OpenAI-compatible server at ``base_url`` with ``requests`` streaming ``/v1/completions``
    requests of ``prompt`` and ``max_tokens``, and returns guidellm's own per-request timings
    from its JSON report, ordered by start time (see the module docstring for what each
    field means and where guidellm takes it).

    :param guidellm: path of the ``guidellm`` executable (guidellm 0.8.1).
    :param base_url: server root, e.g. ``http://127.0.0.1:8000``.
    :param concurrency: number of concurrent streams (closed loop).
    :param rate: requests per second (open loop); ``rate_profile`` picks the arrivals.
    :param requests: number of requests to run.
    :param prompt: the prompt of every request.
    :param max_tokens: ``max_tokens`` of every request.
    :param workdir: folder for the prompt file, the report (``guidellm.json``), guidellm's
        console output (``guidellm.log``) and its datasets cache; created if missing.
    :param timeout_s: wall-clock limit for the whole run (guidellm's start-up takes about
        10 s); on expiry guidellm's process group is killed and ``TimeoutError`` raised.
        Also each request's read timeout.
    :param rate_profile: ``"constant"`` (evenly spaced) or ``"poisson"`` arrivals.
    :param max_worker_processes: cap on guidellm's worker processes (its setting
        ``max_worker_processes``, default 10). guidellm starts
        ``min(concurrency or its max_concurrency, this)`` processes, each running several
        requests on its own asyncio loop; on a machine with few cores fewer processes can mean
        less CPU contention and so a smaller client-side TTFT error. ``None``: guidellm's
        default.
    :raises ValueError: on invalid arguments.
    :raises TimeoutError: if guidellm did not finish within ``timeout_s``.
    :raises RuntimeError: if guidellm failed or wrote no report.
    """
    workdir = pathlib.Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    data_path = workdir / "prompts.jsonl"
    output_path = workdir / "guidellm.json"
    log_path = workdir / "guidellm.log"
    cmd = build_command(
        guidellm,
        base_url,
        data_path=data_path,
        output_path=output_path,
        concurrency=concurrency,
        rate=rate,
        rate_profile=rate_profile,
        requests=requests,
        max_tokens=max_tokens,
        model=model,
        request_timeout_s=timeout_s,
    )
    row = json.dumps({"prompt": prompt}) + "\n"
    data_path.write_text(row * requests)
    output_path.unlink(missing_ok=True)
    (workdir / "command.json").write_text(json.dumps(cmd, indent=1) + "\n")

    with log_path.open("wb") as log:
        # own session: guidellm spawns worker processes; on timeout kill the whole group
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=_env(workdir, max_worker_processes),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise TimeoutError(f"guidellm ran over {timeout_s} s; see {log_path}") from None
        except BaseException:
            _kill_group(proc)
            raise
    if rc != 0 or not output_path.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"guidellm exited with {rc}; its output ends:\n{tail}")
    return parse_report(json.loads(output_path.read_text()))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group led by ``proc`` (guidellm and its workers), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, linear between closest ranks."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def main(argv: list[str] | None = None) -> int:
    """Command line: run guidellm once and print the per-request TTFT p50/p90."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("guidellm", help="path of the guidellm executable")
    parser.add_argument("url", help="server root, e.g. http://127.0.0.1:8000")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--concurrency", type=int)
    mode.add_argument("--rate", type=float)
    parser.add_argument("--poisson", action="store_true", help="Poisson arrivals with --rate")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--prompt", default="Say hello.")
    parser.add_argument(
        "--workdir",
        type=pathlib.Path,
        help="keep guidellm's files here (default: a temporary folder)",
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--workers", type=int, help="cap on guidellm's worker processes")
    args = parser.parse_args(argv)

    def run(workdir: pathlib.Path) -> list[GuidellmRequest]:
        return run_guidellm(
            args.guidellm,
            args.url,
            concurrency=args.concurrency,
            rate=args.rate,
            requests=args.requests,
            prompt=args.prompt,
            max_tokens=args.max_tokens,
            workdir=workdir,
            timeout_s=args.timeout,
            rate_profile="poisson" if args.poisson else "constant",
            max_worker_processes=args.workers,
        )

    if args.workdir is not None:
        recs = run(args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="guidellm-") as tmp:
            recs = run(pathlib.Path(tmp))
    ttfts = [r.ttft_ms for r in recs if r.ok and not math.isnan(r.ttft_ms)]
    ok = sum(r.ok for r in recs)
    print(f"records {len(recs)} (ok {ok}, requested {args.requests})")
    if ttfts:
        print(
            f"TTFT ms p50 {statistics.median(ttfts):.3f}  p90 {_percentile(ttfts, 0.9):.3f}"
            f"  min {min(ttfts):.3f}  max {max(ttfts):.3f}"
        )
    return 0 if ok == args.requests == len(recs) else 1


if __name__ == "__main__":
    sys.exit(main())
