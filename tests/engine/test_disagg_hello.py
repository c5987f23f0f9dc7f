"""The decode side accepts only its own prefill worker: a local process that connects to
the channel's port first, with no hello, a wrong secret or a huge header, is turned away."""

from __future__ import annotations

import json
import socket
import struct
import threading

import ttft.engine.disagg.process as process


def _pair() -> tuple[socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return client, server


def _frame(header: object, payload: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("!II", len(head), len(payload)) + head + payload


def test_only_the_right_secret_says_hello():
    cases = {
        "right": (_frame({"op": "hello", "token": "s3cret"}), True),
        "wrong secret": (_frame({"op": "hello", "token": "guess"}), False),
        "another op": (_frame({"op": "ready", "token": "s3cret"}), False),
        "a payload": (_frame({"op": "hello", "token": "s3cret"}, b"x"), False),
        "not an object": (_frame(["hello"]), False),
        "a huge header": (struct.pack("!II", 1 << 31, 0), False),
        "nothing, then gone": (b"", False),
    }
    for name, (data, expected) in cases.items():
        client, server = _pair()
        try:
            client.sendall(data)
            if name == "nothing, then gone":
                client.close()
            assert process._says_hello(server, "s3cret") is expected, name
        finally:
            client.close()
            server.close()


def test_a_silent_connection_is_given_up_on(monkeypatch):
    monkeypatch.setattr(process, "_HELLO_S", 0.2)
    client, server = _pair()
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(process._says_hello(server, "x")))
    try:
        thread.start()
        thread.join(10)
        assert result == [False]
    finally:
        client.close()
        server.close()


def test_spans_sent_before_ready_are_kept_and_nothing_else_may_come_first():
    import pytest

    from ttft.engine.disagg.channel import ChannelClosed

    worker = process.WorkerProcess({})
    client, worker.sock = _pair()
    try:
        client.sendall(_frame({"op": "spans", "spans": [{"name": "early"}]})
                       + _frame({"op": "ready", "metadata": {"device": "cpu"}}))
        assert worker._ready() == {"op": "ready", "metadata": {"device": "cpu"}}
        assert [h for h, _ in worker.early] == [{"op": "spans", "spans": [{"name": "early"}]}]
        client.sendall(_frame({"op": "token", "key": "k"}))
        with pytest.raises(ChannelClosed, match="'token' message before ready"):
            worker._ready()
    finally:
        client.close()
        worker.sock.close()
