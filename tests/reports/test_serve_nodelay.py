"""``ttft serve``'s listening socket turns Nagle's algorithm off on every connection.

asyncio sets ``TCP_NODELAY`` on an accepted socket only when its ``proto`` is
``IPPROTO_TCP``; a listener made with proto 0 left Nagle on, and a kept-alive connection's
first SSE chunk waited for the client's delayed ACK (about 40 ms on loopback), which
``ttft trace`` reported as ``network``."""

from __future__ import annotations

import asyncio
import socket

from ttft.reports.cli.serve import _bind


async def _accepted_nodelay(sock: socket.socket) -> int:
    """Serve ``sock`` as uvicorn does (``loop.create_server(sock=...)``), connect once and
    return the accepted socket's ``TCP_NODELAY``."""
    loop = asyncio.get_running_loop()
    seen: asyncio.Future[int] = loop.create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport):
            accepted = transport.get_extra_info("socket")
            seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await loop.create_server(Probe, sock=sock)
    try:
        port = sock.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        value = await asyncio.wait_for(seen, 10)
        writer.close()
        return value
    finally:
        server.close()
        await server.wait_closed()


def test_serve_s_socket_is_tcp_and_its_connections_have_nagle_off():
    sock = _bind("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    assert asyncio.run(_accepted_nodelay(sock)) != 0


def test_a_socket_without_its_protocol_named_keeps_nagle_on():
    # the mechanism the fix rests on: the same server over a proto-0 socket
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    assert asyncio.run(_accepted_nodelay(sock)) == 0
