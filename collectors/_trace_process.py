"""The recorder of a traced run in a process of its own (private to ``collectors``): the trace
writer (its span log, its Parquet parts) and the OTLP receivers run there, never in the load
generator's process (docs/design.md, "The client's clock").

Why a process: the load generator stamps ``first_token`` when its event loop reads the bytes.
Anything else of ours in that interpreter (converting rows to Arrow, the log's writes, part
flushes, decoding a server's OTLP exports) holds the interpreter lock and makes the stamp
late. benchmarks/client_accuracy.py, against the packets on loopback, showed it as a tail:
with a writer thread beside the loop, client − wire p90 reached 0.6–8.5 ms in some rounds,
and with the writer here it was at most 0.30 ms against benchmarks/sse_server.py and
0.82 ms against a CPU-bound ``ttft serve`` on the same cores. The child costs the client
one JSON encoding (about 30 µs for 20 rows) and one non-blocking pipe write per request,
done after that request ended.

Two channels to the child:

- control: the child's stdin and stdout, one JSON object a line: first the run's settings,
  then ``want`` (the traces the run waits for), ``poll`` and ``close``; each answered;
- rows: a pipe of frames (u32 little-endian length · a JSON list of row dicts, one
  request's rows), written by :class:`RowPipe` from the load generator's event loop without
  ever blocking it, read to its end by the child before it closes the trace.

The child ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group): the parent
decides when the run stops and tells it. A parent that dies closes both channels, and the
child then appends what the rows pipe still holds and closes the trace as ``close`` would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["Closed", "RecorderError", "RowPipe", "TraceProcess"]

logger = logging.getLogger(__name__)

_FRAME = struct.Struct("<I")
_PIPE_BYTES = 1 << 20
"""The rows pipe's buffer asked of Linux (``F_SETPIPE_SZ``): a second of rows at thousands of
requests a second, so the event loop's writes go straight to the kernel."""
_START_S = 60.0
"""The longest the child may take to import, bind its receivers and open the trace."""
_NICE = 10
"""The recorder's niceness: on a machine whose cores the client, the server traced and the
recorder share, the recorder waits (its pipe and buffers hold the rows meanwhile), not the
client's event loop."""
_ESTIMATED = '"ttft.estimated"'
"""How an estimated span's attributes text names the key (``rows.attributes_json``)."""


class RecorderError(Exception):
    """The child could not start or failed; ``kind`` is the exception's class name there."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _raised(error: Mapping[str, Any]) -> Exception:
    """The child's failure as the exception the in-process recorder raised: ``OSError`` for
    a port or a file, ``ValueError`` for rows that do not fit, else `RecorderError`."""
    kind, message = error["kind"], error["message"]
    if "errno" in error:  # an OSError: as raised, so its strerror and filename say it
        return OSError(error["errno"], error["strerror"], *(
            [error["filename"]] if error.get("filename") is not None else []))
    if kind == "OSError":
        return OSError(message)
    if kind in ("ValueError", "TypeError"):
        return ValueError(message)
    return RecorderError(kind, message)


@dataclass(frozen=True)
class Closed:
    """What the child recorded, given back when it closed the trace.

    Attributes:
        server_rows: span rows the receivers stored.
        trace_ids: the traces those rows belong to.
        cached_ids: the traces with a ``cached_tokens`` attribute above 0.
        error: the first failure to append or close (as raised in-process), or None.
    """

    server_rows: int
    trace_ids: frozenset[str]
    cached_ids: frozenset[str]
    error: Exception | None


class RowPipe:
    """The load generator's end of the rows pipe: :meth:`put` queues one request's rows on
    the event loop's pipe transport (a write the kernel takes at once, or buffered until the
    pipe drains; never a wait), :meth:`finish` flushes and closes it."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self._pipe: IO[bytes] | None = None
        self._transport: asyncio.WriteTransport | None = None
        self._lost: asyncio.Future[None] | None = None
        self._error: Exception | None = None

    async def open(self) -> None:
        """Connect the pipe to the running event loop (once, before the first ``put``)."""
        loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        self._pipe = os.fdopen(self._take_fd(), "wb", buffering=0)
        self._transport, _ = await loop.connect_write_pipe(lambda: _Watch(self), self._pipe)

    def _take_fd(self) -> int:
        if self._fd is None:
            raise ValueError("the rows pipe is already open or closed")
        fd, self._fd = self._fd, None
        return fd

    def put(self, rows: list[dict[str, Any]]) -> None:
        """Send one request's rows (on the event loop; never blocks)."""
        if self._transport is None or self._transport.is_closing():
            return  # a broken pipe was remembered; finish() reports it
        payload = json.dumps(rows, separators=(",", ":")).encode()
        self._transport.write(_FRAME.pack(len(payload)) + payload)

    async def finish(self) -> Exception | None:
        """Flush what is queued and close the pipe (the child reads it to its end); the
        first failure to write (the child gone), or None."""
        if self._transport is not None:
            self._transport.close()  # after the buffered bytes are written
            assert self._lost is not None
            await self._lost
        self.discard()
        return self._error

    def discard(self) -> None:
        """Close the pipe if the load did not (it never ran, or its loop ended without
        :meth:`finish`): the child reads to the pipe's end before it closes the trace."""
        if self._fd is not None:
            os.close(self._take_fd())
        if self._pipe is not None and not self._pipe.closed:
            self._pipe.close()

    def _lost_with(self, exc: Exception | None) -> None:
        if exc is not None and self._error is None:
            self._error = OSError(f"the trace writer process stopped taking rows ({exc})")
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)


class _Watch(asyncio.Protocol):
    def __init__(self, pipe: RowPipe) -> None:
        self.pipe = pipe

    def connection_lost(self, exc: Exception | None) -> None:
        self.pipe._lost_with(exc)


class TraceProcess:
    """A child process holding the run's trace writer and OTLP receivers.

    Attributes:
        http_endpoint, grpc_endpoint: the receivers' endpoints (None: not listening).
        rows: the rows pipe to hand ``loadgen.run`` (as its ``writer``).
    """

    def __init__(self, out: str | os.PathLike[str], metadata: Mapping[str, Any], *,
                 receivers: Mapping[str, Any] | None = None) -> None:
        """Start the child: it binds the receivers (``Collector``'s keyword arguments:
        ``host``, ``http_port``, ``grpc_port``, ``token``; None for none), then opens the
        trace at ``out`` with ``metadata``, and says it is ready.

        Raises:
            OSError: a receiver cannot bind (no file is written then), or the trace cannot
                be created. ValueError, TypeError: bad metadata. RecorderError: the child
                failed otherwise or did not start within a minute.
        """
        read_fd, write_fd = os.pipe()
        _widen(write_fd)
        settings = {"out": os.fspath(out), "metadata": dict(metadata),
                    "receivers": None if receivers is None else dict(receivers),
                    "rows_fd": read_fd}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "ttft.collectors._trace_process"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, pass_fds=(read_fd,))
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        self.rows = RowPipe(write_fd)
        self._closed: Closed | None = None
        try:
            ready = self._ask(settings, timeout_s=_START_S)
        except BaseException:
            self._abandon()
            raise
        if "error" in ready:
            self._abandon()
            raise _raised(ready["error"])
        self.http_endpoint: str | None = ready.get("http_endpoint")
        self.grpc_endpoint: str | None = ready.get("grpc_endpoint")

    def _ask(self, message: Mapping[str, Any], timeout_s: float | None = None
             ) -> dict[str, Any]:
        """Send one control message and read its answer."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            return {"error": {"kind": "RecorderError", "message": self._gone()}}
        line = _read_line(self._proc.stdout, timeout_s)
        if not line:
            return {"error": {"kind": "RecorderError", "message": self._gone()}}
        answer = json.loads(line)
        assert isinstance(answer, dict)
        return answer

    def _gone(self) -> str:
        code = self._proc.poll()
        return ("the trace writer process ended unexpectedly"
                + ("" if code is None else f" (exit status {code})"))

    def want(self, trace_ids: set[str]) -> None:
        """The traces the run waits for spans of (`poll` counts those still missing)."""
        self._ask({"cmd": "want", "ids": sorted(trace_ids)})

    def poll(self) -> tuple[bool, int]:
        """Whether every wanted trace has spans, and the span rows received so far."""
        answer = self._ask({"cmd": "poll"})
        if "error" in answer:
            raise _raised(answer["error"])
        return answer["missing"] == 0, answer["rows"]

    def close(self) -> Closed:
        """Close the rows pipe if the load never opened it, then have the child read the
        pipe to its end, stop the receivers and close the trace. Idempotent."""
        if self._closed is not None:
            return self._closed
        self.rows.discard()
        answer = self._ask({"cmd": "close"})
        self._abandon()
        if "error" in answer and "server_rows" not in answer:
            self._closed = Closed(0, frozenset(), frozenset(), _raised(answer["error"]))
        else:
            error = answer.get("error")
            self._closed = Closed(answer["server_rows"], frozenset(answer["trace_ids"]),
                                  frozenset(answer["cached_ids"]),
                                  None if error is None else _raised(error))
        return self._closed

    def _abandon(self) -> None:
        """Close the control channel and wait for the child (it closes on end of input)."""
        self.rows.discard()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()
        try:
            self._proc.wait(_START_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _widen(fd: int) -> None:
    """Ask for a pipe buffer of `_PIPE_BYTES` where Linux offers it (else keep the default)."""
    try:
        import fcntl
    except ImportError:
        return
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setsize is None:
        return
    try:
        fcntl.fcntl(fd, setsize, _PIPE_BYTES)
    except OSError:
        pass  # above /proc/sys/fs/pipe-max-size: the default buffer still works


def _read_line(stream: IO[bytes], timeout_s: float | None) -> bytes:
    """One line of ``stream``; empty at its end or when ``timeout_s`` passed first."""
    if timeout_s is None:
        return stream.readline()
    found: list[bytes] = []
    reader = threading.Thread(target=lambda: found.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return found[0] if found else b""


# --- the child ---------------------------------------------------------------------------


class _Child:
    """The child's state: the sink the receivers feed, the writer, the rows reader."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        from ttft.collectors._trace_sink import SeenSink

        self.settings = settings
        self.sink = SeenSink()
        self.collector: Any = None
        self.writer: Any = None
        self.wanted: set[str] = set()
        self.estimated: list[str] = []
        self.error: BaseException | None = None
        self.reader: threading.Thread | None = None

    def start(self) -> dict[str, Any]:
        """Bind the receivers, open the writer, start reading rows; the ``ready`` answer."""
        from ttft.collectors.otlp_grpc import Collector
        from ttft.collectors.writer import TraceWriter

        receivers = self.settings["receivers"]
        if receivers is not None:
            self.collector = Collector(self.sink, **receivers)
            self.collector.start()  # a busy port fails here, before any file exists
        try:
            self.writer = TraceWriter(self.settings["out"], metadata=self.settings["metadata"],
                                      log=True)
        except BaseException:
            self.sink.attach(None)
            self._stop_receivers()
            raise
        self.sink.attach(self.writer)
        self.reader = threading.Thread(target=self._read_rows, args=(self.settings["rows_fd"],),
                                       name="ttft-trace-rows", daemon=True)
        self.reader.start()
        return {"ready": True,
                "http_endpoint": None if self.collector is None else self.collector.http_endpoint,
                "grpc_endpoint": None if self.collector is None else self.collector.grpc_endpoint}

    def _read_rows(self, fd: int) -> None:
        """Append the rows pipe's requests until its end: every whole frame one read
        brought, in one append (one Arrow conversion and one log record for all of them:
        about 4 µs a row for one request's rows alone, 1 µs in a batch of 2,000)."""
        buffer = bytearray()
        while chunk := os.read(fd, _PIPE_BYTES):
            buffer += chunk
            requests, used = _frames(buffer)
            del buffer[:used]
            if requests:
                self._append(requests)
        os.close(fd)  # a torn last frame (the parent died mid-write) held nothing whole

    def _append(self, requests: list[list[dict[str, Any]]]) -> None:
        """Append the requests' rows at once; where that fails, each request's alone, so
        one request's bad row never costs another its rows."""
        for rows in requests:
            self.estimated += [r["trace_id"] for r in rows
                               if _ESTIMATED in (r.get("attributes") or "")]
        try:
            self.writer.append([r for rows in requests for r in rows])
            return
        except Exception as exc:
            if not isinstance(exc, ValueError) or len(requests) == 1:  # not one bad row
                logger.exception("%s: cannot append requests' rows", self.writer.path)
                self.error = self.error or exc
                return
        for rows in requests:
            try:
                self.writer.append(rows)
            except Exception as exc:
                logger.exception("%s: cannot append a request's rows", self.writer.path)
                self.error = self.error or exc

    def answer(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """The answer to one control message."""
        if message.get("cmd") == "want":
            self.wanted = set(message["ids"])
            return {}
        with self.sink.lock:
            return {"rows": self.sink.rows, "missing": len(self.wanted - self.sink.trace_ids)}

    def close(self) -> dict[str, Any]:
        """Read the rows pipe to its end, stop the receivers, close the trace."""
        from ttft.tracer.schema import smallest_examples

        if self.reader is not None:
            self.reader.join()
        self._stop_receivers()
        try:
            if self.estimated:  # one run per writer: its count is the run's
                self.writer.set_metadata(estimated={
                    "count": len(self.estimated),
                    "examples": smallest_examples([self.estimated])})
        except Exception as exc:
            logger.exception("%s: cannot record the estimated spans", self.writer.path)
            self.error = self.error or exc
        try:
            self.writer.close()
        except Exception as exc:
            self.error = self.error or exc
        with self.sink.lock:
            return {"server_rows": self.sink.rows, "trace_ids": sorted(self.sink.trace_ids),
                    "cached_ids": sorted(self.sink.cached_ids),
                    "error": None if self.error is None else _described(self.error)}

    def _stop_receivers(self) -> None:
        if self.collector is not None:
            self.collector.stop()


def _frames(buffer: bytearray) -> tuple[list[list[dict[str, Any]]], int]:
    """The rows of each whole frame (one request's) at the start of ``buffer``, and the
    bytes they took."""
    requests: list[list[dict[str, Any]]] = []
    at = 0
    while at + _FRAME.size <= len(buffer):
        (size,) = _FRAME.unpack_from(buffer, at)
        if at + _FRAME.size + size > len(buffer):
            break
        requests.append(json.loads(bytes(buffer[at + _FRAME.size:at + _FRAME.size + size])))
        at += _FRAME.size + size
    return requests, at


def _described(exc: BaseException) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, OSError) and exc.errno is not None:
        out.update(errno=exc.errno, strerror=exc.strerror,
                   filename=None if exc.filename is None else os.fspath(exc.filename))
    return out


def _child_main() -> None:
    """The child: settings from the first line of stdin, then answers until ``close`` or the
    end of its input."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(os, "nice"):  # the client and the server traced come first for the CPU
        os.nice(_NICE)
    logging.basicConfig(level=logging.WARNING, format="ttft trace writer: %(message)s")
    control, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the answers

    def say(message: Mapping[str, Any]) -> None:
        answers.write(json.dumps(message).encode() + b"\n")
        answers.flush()

    child = _Child(json.loads(control.readline()))
    try:
        say(child.start())
    except Exception as exc:
        say({"error": _described(exc)})
        return
    while line := control.readline():
        message = json.loads(line)
        if message.get("cmd") == "close":
            break
        say(child.answer(message))
    closed = child.close()
    if line:
        say(closed)


if __name__ == "__main__":
    _child_main()
