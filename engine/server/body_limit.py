"""An ASGI wrapper that refuses request bodies over a size limit (413) before the
application parses them, so one request cannot take all memory."""

from __future__ import annotations

import json
from typing import Any

from ttft.engine.server.errors import APIError

__all__ = ["MAX_BODY_BYTES", "BodyLimit"]

Scope = dict[str, Any]

MAX_BODY_BYTES = 4 << 20
"""Largest request body the server accepts; a larger one is answered 413 before it is
parsed."""


class BodyLimit:
    """Answer 413 (OpenAI's error body, ``code: request_too_large``, ``Connection: close``)
    when a request declares a ``Content-Length`` over ``max_bytes`` (before reading a byte)
    or streams more than that; otherwise hand the application the whole body at once, then
    the real ``receive`` (so it still sees a client's disconnect)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: let the app see it
                first = message
                break
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return first
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Any) -> None:
        message = f"request body larger than {self.max_bytes} bytes"
        body = json.dumps(APIError(413, message, code="request_too_large").body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    """The declared length; an unparseable one counts as over any limit."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else 1 << 62
    return None
