"""Security properties: every listener binds 127.0.0.1 unless told otherwise; ``ttft serve
--api-key`` and ``ttft collect --token`` require a bearer token compared in constant time;
bodies have size limits; incoming data is never unpickled or evaluated; trace files opened
by the CLI are only read.

Listeners are started for real on port 0 (or a free port) and their bound address is read
back from the kernel's socket table; source properties are checked on the syntax tree of
every module of the installed packages, never with regular expressions.
"""

from __future__ import annotations

import ast
import contextlib
import gzip
import hashlib
import importlib
import inspect
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pyarrow as pa
import pytest
import typer.main
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from typer.testing import CliRunner

from ttft.collectors import read_spans, write_trace
from ttft.collectors.otlp_grpc import EXPORT_METHOD, Collector, OTLPGrpcReceiver
from ttft.collectors.otlp_receiver import MAX_BODY_BYTES, OTLPReceiver
from ttft.collectors.synthetic import generate
from ttft.engine import server as engine_server
from ttft.engine.server import inprocess
from ttft.reports.cli import app

LOOPBACK = "127.0.0.1"
MODEL = "ttft-tiny"
KEY = "k-3f9a"
TIMEOUT_S = 20.0
START_TIMEOUT_S = 90.0  # a fresh interpreter importing torch on a busy 2-core machine
PACKAGES = ("tracer", "engine", "collectors", "analysis", "reports")
T0_NS = 1_700_000_000_000_000_000
runner = CliRunner()


# -- helpers ---------------------------------------------------------------------------


def listening(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on ``port``, from the kernel's
    socket tables (``/proc/net/tcp`` and ``tcp6``; gRPC listens on an IPv6 socket bound to
    ``::ffff:127.0.0.1``, the IPv4 loopback, given here as ``127.0.0.1``)."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not tables[0].exists():
        pytest.skip("reading bound addresses needs Linux /proc/net/tcp")
    found = set()
    for table in tables:
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            if len(raw) == 4:
                found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:  # four host-order 32-bit words; an IPv4-mapped address is that IPv4
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                text = socket.inet_ntop(socket.AF_INET6, words)
                found.add(text.removeprefix("::ffff:") if "." in text else text)
    return found


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def export_request(spans: int = 1, pad_bytes: int = 0) -> bytes:
    """An OTLP ``ExportTraceServiceRequest`` with ``spans`` spans, serialized; ``pad_bytes``
    of one repeated letter in a resource attribute (a body that compresses very well)."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    service = resource_spans.resource.attributes.add(key="service.name")
    service.value.string_value = "api"
    if pad_bytes:
        pad = resource_spans.resource.attributes.add(key="pad")
        pad.value.string_value = "a" * pad_bytes
    scope = resource_spans.scope_spans.add()
    for index in range(spans):
        span = scope.spans.add()
        span.trace_id = bytes.fromhex("5b8efff798038103d269b633813fc60c")
        span.span_id = (index + 1).to_bytes(8, "big")
        span.name = "tokenize"
        span.start_time_unix_nano, span.end_time_unix_nano = T0_NS + index, T0_NS + index + 5
    return request.SerializeToString()


def grpc_status(port: int, body: bytes, metadata=None) -> grpc.StatusCode:
    with grpc.insecure_channel(f"{LOOPBACK}:{port}") as channel:
        call = channel.unary_unary(
            EXPORT_METHOD, response_deserializer=ExportTraceServiceResponse.FromString
        )
        try:
            call(body, metadata=metadata, timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def cli(*args: str) -> subprocess.Popen:
    """``ttft ARGS`` in a fresh interpreter (its own signal handlers, its own sockets)."""
    return subprocess.Popen(
        [sys.executable, "-m", "ttft.reports.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def stopped_at_exit(process: subprocess.Popen):
    """SIGTERM ``process`` when the block ends (SIGKILL if it does not stop in time); yields
    a dict that then holds its ``stderr``."""
    out: dict[str, str] = {}
    try:
        yield out
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            out["stderr"] = process.communicate(timeout=TIMEOUT_S)[1]
        except subprocess.TimeoutExpired:
            process.kill()
            out["stderr"] = process.communicate(timeout=TIMEOUT_S)[1]


def alive(process: subprocess.Popen) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"exited early: {process.communicate()[1]}")
    return True


def ready(url: str, process: subprocess.Popen) -> bool:
    alive(process)
    try:
        return httpx.get(url, timeout=1.0).status_code < 500
    except httpx.TransportError:
        return False


def package_modules() -> list[Path]:
    """Every Python file of the installed ttft packages."""
    dirs = []
    for name in PACKAGES:
        dirs += [Path(p) for p in importlib.import_module(f"ttft.{name}").__path__]
    files = sorted({f for d in dirs for f in d.rglob("*.py")})
    assert len(files) > 50, files
    return files


def tree_of(module: str) -> ast.Module:
    path = Path(inspect.getfile(importlib.import_module(module)))
    return ast.parse(path.read_text(), filename=str(path))


def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a name or attribute chain (``?`` for a part that is not a name, as
    in ``?.eval`` for ``model().eval``), else ``""``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value) or '?'}.{node.attr}"
    return ""


def function(tree: ast.AST, name: str) -> ast.FunctionDef:
    found = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and n.name == name
    ]
    assert len(found) == 1, f"one function {name!r} expected, found {len(found)}"
    return found[0]


def names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def constant(node: ast.expr | None) -> object:
    return node.value if isinstance(node, ast.Constant) else ...


# -- listeners bind loopback -----------------------------------------------------------


def test_cli_listener_options_default_to_loopback():
    commands = typer.main.get_command(app).commands
    listeners = {("serve", "host"), ("collect", "host"), ("trace", "receiver_host"),
                 ("sweep", "receiver_host")}
    for command, option in listeners:
        params = {p.name: p for p in commands[command].params}
        assert params[option].default == LOOPBACK, (command, option)
    hosts = [(c, p.name, p.default) for c, cmd in commands.items() for p in cmd.params
             if "host" in p.name]
    assert {(c, n) for c, n, _ in hosts} == listeners
    assert all(default == LOOPBACK for _, _, default in hosts), hosts


def test_library_listeners_default_to_loopback():
    from ttft.collectors.trace_run import TraceSpec

    defaults = {
        "OTLPReceiver": inspect.signature(OTLPReceiver).parameters["host"].default,
        "OTLPGrpcReceiver": inspect.signature(OTLPGrpcReceiver).parameters["host"].default,
        "Collector": inspect.signature(Collector).parameters["host"].default,
        "engine.server.serve": inspect.signature(engine_server.serve).parameters["host"].default,
        "engine.server.serving": inspect.signature(inprocess.serving).parameters["host"].default,
        "engine.server.free_port": inspect.signature(inprocess.free_port)
        .parameters["host"].default,
        "collectors.trace_run.TraceSpec": TraceSpec(url="http://x").receiver_host,
    }
    assert defaults == dict.fromkeys(defaults, LOOPBACK)


def test_no_module_names_a_wildcard_or_non_loopback_bind_address():
    """No listener is given a host other than loopback in code: ``host=``/``receiver_host=``
    arguments are the caller's variable or ``127.0.0.1``, and no module spells a wildcard
    address; ``ttft trace`` hands its receivers the spec's (loopback) host."""
    found = []
    for path in package_modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in ("0.0.0.0", "::", "[::]"):
                found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg in ("host", "receiver_host") and isinstance(kw.value, ast.Constant):
                        if kw.value.value not in (LOOPBACK, "localhost"):
                            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:60]}")
    assert found == []
    # ttft trace's receivers run in its recorder process: trace_run names their host (the
    # spec's) and the recorder hands those settings to the Collector as they came
    live = tree_of("ttft.collectors.trace_run")
    settings = [n for n in ast.walk(live) if isinstance(n, ast.Dict)
                and "host" in [constant(k) for k in n.keys if k is not None]]
    assert settings and all(
        ast.unparse(n.values[[constant(k) for k in n.keys].index("host")])
        == "spec.receiver_host" for n in settings)
    recorder = tree_of("ttft.collectors._trace_process")
    receivers = [n for n in ast.walk(recorder) if isinstance(n, ast.Call)
                 and dotted(n.func) in ("OTLPReceiver", "OTLPGrpcReceiver", "Collector")]
    assert receivers and all([ast.unparse(k.value) for k in n.keywords]
                             == ["receivers"] and not keyword(n, "host") for n in receivers)


def test_receivers_bind_loopback_when_no_host_is_given():
    tables: list[pa.Table] = []
    with OTLPReceiver(tables.append, port=0) as http:
        assert listening(http.port) == {LOOPBACK}
    with OTLPGrpcReceiver(tables.append, port=0) as rpc:
        assert listening(rpc.port) == {LOOPBACK}
    with Collector(tables.append, http_port=0, grpc_port=0) as both:
        assert listening(both.http.port) == {LOOPBACK}
        assert listening(both.grpc.port) == {LOOPBACK}
    assert tables == []


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The reference server from ``engine.server.serving`` with its default host and an
    API key: ``(base url, port)``."""
    engine = engine_server.build_engine(
        "tiny", device="cpu", tokenizer_cache_dir=str(tmp_path_factory.mktemp("tok"))
    )
    with inprocess.serving(engine, model_name=MODEL, api_key=KEY) as url:
        yield url, int(url.rsplit(":", 1)[1])


def test_inprocess_server_binds_loopback(served):
    url, port = served
    assert url.startswith(f"http://{LOOPBACK}:")
    assert listening(port) == {LOOPBACK}


def test_trace_receiver_binds_loopback_by_default(served, tmp_path):
    """``ttft trace``'s OTLP receiver, started for a one-request run against the served
    engine, listens on loopback while the run lasts."""
    from ttft.collectors.trace_run import TraceSpec, trace_server

    url, _ = served
    seen: dict[str, set[str]] = {}

    def on_start(requests: int, endpoint: str) -> None:
        port = int(endpoint.rsplit(":", 1)[1].split("/", 1)[0])
        seen[endpoint] = listening(port)

    spec = TraceSpec(url=url, api_key=KEY, burst=1, warmup=0, prompt_tokens=(8, 8),
                     output_tokens=1, receiver_port=0, span_wait_s=0.0, timeout_s=TIMEOUT_S)
    run = trace_server(spec, tmp_path / "run.parquet", on_start=on_start)
    assert [r.status_code for r in run.results] == [200]
    (endpoint, addresses), = seen.items()
    assert endpoint.startswith(f"http://{LOOPBACK}:") and addresses == {LOOPBACK}


# -- bearer tokens ---------------------------------------------------------------------

WRONG_AUTHORIZATION = [
    None,
    "",
    "Bearer",
    "Bearer wrong",
    f"Basic {KEY}",
    f"Token {KEY}",
    f"Bearer {KEY}x",
    f"Bearer {KEY[:-1]}",
    f"Bearer {KEY.upper()}",
    f"Bearer{KEY}",
]
RIGHT_AUTHORIZATION = [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER  {KEY}"]


def _headers(authorization: str | None) -> dict[str, str]:
    return {} if authorization is None else {"Authorization": authorization}


def test_api_key_guards_every_api_endpoint_and_leaves_health_open(served):
    url, _ = served
    calls = [
        ("GET", "/v1/models", None),
        ("POST", "/tokenize", {"prompt": "hi"}),
        ("POST", "/detokenize", {"tokens": [104, 105]}),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 1}),
        ("POST", "/v1/chat/completions",
         {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
    ]
    with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
        for method, path, body in calls:
            for authorization in WRONG_AUTHORIZATION:
                answer = client.request(method, path, json=body, headers=_headers(authorization))
                assert answer.status_code == 401, (path, authorization, answer.text)
                assert answer.json()["error"]["code"] == "invalid_api_key"
            for authorization in RIGHT_AUTHORIZATION:
                answer = client.request(method, path, json=body, headers=_headers(authorization))
                assert answer.status_code == 200, (path, authorization, answer.text)
        # Bytes that are not ASCII (latin-1 on the wire) are a wrong key, not a crash.
        odd = client.get("/v1/models", headers={"Authorization": b"Bearer \xff\xfe" + KEY.encode()})
        assert odd.status_code == 401
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200


def _check_compare_digest(fn: ast.FunctionDef, secrets: set[str]) -> None:
    """``fn`` calls ``hmac.compare_digest`` and never compares a secret with ``==``,
    ``!=``, ``in`` or ``not in`` (whose time depends on where the strings differ)."""
    calls = [dotted(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)]
    assert "hmac.compare_digest" in calls, (fn.name, calls)
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare):
            variable_time = any(
                isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops
            )
            touched = names_in(node) & secrets
            assert not (variable_time and touched), (fn.name, ast.unparse(node))


def test_tokens_are_compared_in_constant_time():
    server = tree_of("ttft.engine.server.routes")
    _check_compare_digest(function(server, "authorize"), {"api_key", "token", "header"})
    common = tree_of("ttft.collectors._otlp_common")
    _check_compare_digest(function(common, "bearer_ok"), {"token", "credentials",
                                                          "authorization"})
    # The receivers check the token only through bearer_ok; they compare it with nothing.
    for module in ("ttft.collectors.otlp_receiver", "ttft.collectors.otlp_grpc"):
        tree = tree_of(module)
        calls = [dotted(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
        assert "bearer_ok" in calls, module
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and "_token" in names_in(node):
                assert all(isinstance(op, ast.Is | ast.IsNot) for op in node.ops), (
                    module, ast.unparse(node))


def test_serve_cli_binds_loopback_and_requires_the_api_key(tmp_path):
    port = inprocess.free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ttft.reports.cli", "serve", "--port", str(port), "--api-key",
         KEY, "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TTFT_CACHE_DIR": str(tmp_path / "cache"), "TTFT_SKIP_PEAKS": "1"},
    )
    url = f"http://{LOOPBACK}:{port}"
    with stopped_at_exit(process) as done:
        wait_until(lambda: ready(f"{url}/health", process), START_TIMEOUT_S, "ttft serve")
        assert listening(port) == {LOOPBACK}
        assert httpx.get(f"{url}/v1/models", timeout=TIMEOUT_S).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.get(f"{url}/v1/models", headers=wrong, timeout=TIMEOUT_S).status_code == 401
        right = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{url}/v1/models", headers=right, timeout=TIMEOUT_S).status_code == 200
    # uvicorn shuts down gracefully and re-raises the SIGTERM it caught; serve turns that
    # into an exit with 143 = 128 + SIGTERM once its trace is flushed
    assert process.returncode in (0, 128 + signal.SIGTERM), done["stderr"]
    assert "Traceback" not in done["stderr"], done["stderr"]


def test_collect_cli_binds_loopback_and_requires_the_token(tmp_path):
    http_port, grpc_port = inprocess.free_port(), inprocess.free_port()
    out = tmp_path / "spans"
    process = cli("collect", "-o", str(out), "--http-port", str(http_port), "--grpc-port",
                  str(grpc_port), "--token", KEY)
    endpoint = f"http://{LOOPBACK}:{http_port}/v1/traces"
    proto = {"Content-Type": "application/x-protobuf"}
    body = export_request(spans=2)
    with stopped_at_exit(process) as done:
        # Ready once both ports listen (asked of the kernel: a probe would be a request).
        wait_until(lambda: alive(process) and listening(http_port) and listening(grpc_port),
                   START_TIMEOUT_S, "ttft collect")
        assert listening(http_port) == {LOOPBACK}
        assert listening(grpc_port) == {LOOPBACK}
        with httpx.Client(timeout=TIMEOUT_S) as client:
            statuses = [
                client.post(endpoint, content=body, headers={**proto, **_headers(a)}).status_code
                for a in (None, "Bearer wrong", f"Basic {KEY}", f"Bearer {KEY}")
            ]
        assert statuses == [401, 401, 401, 200]
        codes = [grpc_status(grpc_port, body, m) for m in (
            None, (("authorization", "Bearer wrong"),), (("authorization", f"Bearer {KEY}"),))]
        assert codes == [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED,
                         grpc.StatusCode.OK]
    assert process.returncode == 0, done["stderr"]
    assert "collected 4 spans from 7 requests (5 requests rejected" in done["stderr"], done[
        "stderr"]
    assert read_spans(out).num_rows == 4  # two spans from each accepted export, no others


# -- size limits -----------------------------------------------------------------------


def test_http_receiver_rejects_oversized_bodies_before_reading_them():
    assert OTLPReceiver(print, port=0).max_body_bytes == MAX_BODY_BYTES == 64 << 20
    collector = Collector(print, http_port=0, grpc_port=0)
    assert collector.http.max_body_bytes == collector.grpc.max_message_bytes == MAX_BODY_BYTES
    tables: list[pa.Table] = []
    small, big = export_request(spans=1), export_request(spans=1, pad_bytes=1 << 20)
    limit = 4096
    proto = {"Content-Type": "application/x-protobuf"}
    with OTLPReceiver(tables.append, port=0, max_body_bytes=limit) as receiver, \
            httpx.Client(timeout=TIMEOUT_S) as client:
        assert client.post(receiver.endpoint, content=small, headers=proto).status_code == 200
        assert client.post(receiver.endpoint, content=big, headers=proto).status_code == 413
        bomb = gzip.compress(big)  # small on the wire, over the limit once decoded
        assert len(bomb) < limit < len(big)
        assert client.post(receiver.endpoint, content=bomb,
                           headers={**proto, "Content-Encoding": "gzip"}).status_code == 413
        # Headers are bounded too (http.server: 64 KiB a line, 100 lines).
        too_long = {**proto, "X-Big": "a" * (1 << 20)}
        assert client.post(receiver.endpoint, content=small, headers=too_long).status_code == 431
        too_many = {**proto, **{f"X-{i}": "a" for i in range(200)}}
        assert client.post(receiver.endpoint, content=small, headers=too_many).status_code == 431
        # A declared terabyte is refused from the headers alone: no byte of it is sent.
        with socket.create_connection((LOOPBACK, receiver.port), timeout=TIMEOUT_S) as raw:
            raw.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: "
                        b"application/x-protobuf\r\nContent-Length: 1000000000000\r\n\r\n")
            assert raw.recv(64).startswith(b"HTTP/1.1 413")
    assert sum(t.num_rows for t in tables) == 1


def test_grpc_receiver_rejects_oversized_messages():
    tables: list[pa.Table] = []
    small, big = export_request(spans=1), export_request(spans=200)
    with OTLPGrpcReceiver(tables.append, port=0, max_message_bytes=len(small) + 10) as rpc:
        assert grpc_status(rpc.port, small) == grpc.StatusCode.OK
        assert grpc_status(rpc.port, big) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert sum(t.num_rows for t in tables) == 1


def test_server_rejects_an_oversized_body(served):
    url, port = served
    limit = getattr(engine_server, "MAX_BODY_BYTES", None)
    if limit is None:
        pytest.xfail(
            "engine/server.py has no request body limit: create_app reads any body whole "
            "(FastAPI/pydantic), so one request can take all memory; wanted: MAX_BODY_BYTES "
            "and 413 for a larger Content-Length or streamed body"
        )
    head = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    fits = head + b" " * (limit - len(head))
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
        assert client.post("/v1/completions", content=fits, headers=auth).status_code == 200
        over = client.post("/v1/completions", content=fits + b" ", headers=auth)
        assert over.status_code == 413 and "error" in over.json()

        def chunks():  # no Content-Length: the limit must hold while the body streams
            yield head
            for _ in range(limit // 65536 + 1):
                yield b" " * 65536

        streamed = client.post("/v1/completions", content=chunks(), headers=auth)
        assert streamed.status_code == 413
    with socket.create_connection((LOOPBACK, port), timeout=TIMEOUT_S) as raw:
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000000000000\r\n\r\n")
        assert raw.recv(64).startswith(b"HTTP/1.1 413")


def test_server_refuses_oversized_headers_and_keeps_serving(served):
    url, _ = served
    with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
        try:
            status = client.get("/health", headers={"X-Big": "a" * (1 << 20)}).status_code
        except httpx.TransportError:  # h11's header limit: the server drops the connection
            status = None
        assert status in (None, 400, 431)
        assert client.get("/health").status_code == 200


# -- nothing unpickles or evaluates incoming data --------------------------------------

UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve",
                  "joblib"}


def _unsafe_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def where(node: ast.AST) -> str:
        return f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}"

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [where(node) for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in UNSAFE_MODULES:
                found.append(where(node))
        elif isinstance(node, ast.Attribute) and node.attr in ("PyExtensionType",
                                                                "read_pickle", "set_auto_load"):
            found.append(where(node))
        elif isinstance(node, ast.Call):
            name = dotted(node.func)
            last = name.rsplit(".", 1)[-1]
            if name in ("eval", "exec", "compile", "__import__", "builtins.eval",
                        "builtins.exec", "os.system", "os.popen"):
                found.append(where(node))
            elif last == "load" and name.split(".")[0] == "yaml":
                loader = dotted(keyword(node, "Loader") or ast.Constant(None))
                if not loader.endswith("SafeLoader") and len(node.args) < 2:
                    found.append(where(node))
            elif name in ("torch.load",) and constant(keyword(node, "weights_only")) is not True:
                found.append(where(node))
            elif name in ("np.load", "numpy.load") and constant(
                    keyword(node, "allow_pickle")) not in (False, ...):
                found.append(where(node))
            elif name.startswith("subprocess.") and constant(keyword(node, "shell")) not in (
                    False, ...):
                found.append(where(node))
    return found


def test_no_module_unpickles_or_evaluates_data():
    found = [use for path in package_modules() for use in _unsafe_uses(path)]
    assert found == []


def test_the_unsafe_use_scan_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nfrom marshal import loads\nimport yaml, torch, subprocess\n"
        "eval('1')\nexec('x = 1')\nyaml.load(s)\ntorch.load(f)\n"
        "subprocess.run('ls', shell=True)\nimport numpy as np\nnp.load(f, allow_pickle=True)\n"
        "yaml.load(s, Loader=yaml.SafeLoader)\ntorch.load(f, weights_only=True)\n"
    )
    assert len(_unsafe_uses(bad)) == 8


def test_parquet_reading_cannot_run_pickled_extension_types():
    """pyarrow before 14.0.1 unpickled ``PyExtensionType`` metadata from any Parquet or IPC
    file it read (CVE-2023-47248); later versions refuse it. ttft reads Parquet with pyarrow
    only, and its pandas conversion reads the JSON ``pandas`` metadata, never pickles."""
    major, minor, patch = (int(p) for p in pa.__version__.split(".")[:3])
    assert (major, minor, patch) >= (14, 0, 1)
    deps = Path(__file__).resolve().parents[1] / "pyproject.toml"
    assert '"pyarrow>=15"' in deps.read_text()


# -- trace files opened by the CLI are only read ---------------------------------------

WRITE_CALLS = {"os.replace", "os.rename", "os.remove", "os.unlink", "os.rmdir", "os.makedirs",
               "os.mkdir", "os.chmod", "os.truncate", "shutil.rmtree", "shutil.move",
               "shutil.copy", "shutil.copyfile", "_write_atomic", "TraceWriter",
               "pq.ParquetWriter", "pq.write_table", "write_trace"}
WRITE_METHODS = {"write_bytes", "write_text", "unlink", "rename", "rmdir", "mkdir", "touch",
                 "chmod", "write_table", "truncate", "write"}


def _writes(node: ast.AST) -> set[str]:
    """The calls under ``node`` that may change a file (by name; ``Path.replace`` is told
    from ``str.replace`` only through ``os.replace``, which ttft uses)."""
    calls = {dotted(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    return {c for c in calls if c in WRITE_CALLS or c.rsplit(".", 1)[-1] in WRITE_METHODS}


def _open_modes(tree: ast.AST) -> list[tuple[int, object]]:
    """Every ``open(...)``-like call (builtin, ``x.open``, ``gzip.open``...) and its mode."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and dotted(node.func).rsplit(".", 1)[-1] == "open":
            name = dotted(node.func)
            if name == "os.open":
                out.append((node.lineno, ast.unparse(node.args[1]) if len(node.args) > 1
                            else None))
                continue
            positional = 0 if isinstance(node.func, ast.Attribute) and name not in (
                "gzip.open", "io.open", "bz2.open", "lzma.open", "builtins.open") else 1
            mode = keyword(node, "mode")
            if mode is None and len(node.args) > positional:
                mode = node.args[positional]
            out.append((node.lineno, "r" if mode is None else constant(mode)))
    return out


def test_trace_readers_open_files_read_only():
    readers = [tree_of(f"ttft.collectors.{m}") for m in ("parquet", "reader", "errors")]
    readers += [tree_of(f"ttft.collectors.importers.{m}") for m in (
        "_base", "_chrome_convert", "_mapping_apply", "chrome", "jaeger", "mapping", "otlp",
        "ttft_parquet", "__init__")]
    # a stream (stdin, a FIFO) is read once into a file of the reader's own temporary
    # directory, so the format can be guessed from it; nothing else is ever written
    reader = readers[1]
    spool = function(reader, "_spooled")
    assert "tempfile.TemporaryDirectory" in {dotted(n.func) for n in ast.walk(spool)
                                             if isinstance(n, ast.Call)}
    assert [mode for _, mode in _open_modes(spool)] == ["wb", "rb"]
    assert _writes(function(reader, "_copy")) == {"target.write"}
    for tree in readers:  # the read path only reads
        for line, mode in _open_modes(tree):
            if tree is reader and spool.lineno <= line <= spool.end_lineno:
                continue
            assert mode in ("r", "rb", "rt", "os.O_RDONLY", "os.O_RDONLY | os.O_NONBLOCK"), (
                line, mode)
        assert _writes(tree) == ({"target.write"} if tree is reader else set())
    files = tree_of("ttft.collectors.layout")
    assert _writes(function(files, "part_files")) == set()
    # the scan sees writes: the rename of every atomic write, and the Parquet write
    assert "os.replace" in _writes(function(files, "_replacing"))
    assert "pq.write_table" in _writes(function(files, "write_atomic"))


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind, bytes' digest and modification time."""
    out = {}
    for path in sorted([root, *root.rglob("*")]):
        info = path.stat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        out[str(path.relative_to(root))] = (stat.S_IFMT(info.st_mode), digest, info.st_mtime_ns)
    return out


def test_cli_commands_only_read_their_traces(tmp_path):
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    out.mkdir()
    one = inputs / "one.parquet"
    write_trace(one, generate(40, seed=1).table, {"workload": {"test": "one"}})
    parts = inputs / "run.parquet.parts"  # what a writer that never closed leaves
    parts.mkdir()
    table = generate(40, seed=2).table
    half = table.num_rows // 2
    write_trace(parts / "part-000000.parquet", table.slice(0, half))
    write_trace(parts / "part-000001.parquet", table.slice(half))
    before = _snapshot(inputs)
    paths = [p for p in (inputs, *inputs.rglob("*"))]
    for path in paths:  # read-only for a normal user; root writes anyway, so the
        path.chmod(path.stat().st_mode & ~0o222)  # snapshot below is the real check
    try:
        commands = [
            ["analyze", str(one)],
            ["analyze", str(one), "--json", "--per-request", str(out / "per.parquet")],
            ["analyze", str(parts), "--policy", "shared"],
            ["report", str(one), "-o", str(out / "report.html")],
            ["report", str(parts)],
            ["export", str(one), "--perfetto", str(out / "one.json")],
            ["export", str(parts), "--perfetto", str(out / "parts.json"), "--requests", "0"],
            ["compare", str(one), str(parts), "--json", "--resamples", "50"],
        ]
        for args in commands:
            result = runner.invoke(app, args)
            assert result.exit_code == 0, (args, result.output)
    finally:
        for path in paths:
            path.chmod(path.stat().st_mode | 0o200)
    assert _snapshot(inputs) == before
    assert sorted(p.name for p in out.iterdir()) == ["one.json", "parts.json", "per.parquet",
                                                     "report.html"]
