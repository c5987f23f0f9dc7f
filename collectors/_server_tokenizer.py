"""Token counts by a server's own tokenizer, in whichever known dialect the server speaks.

The dialects, tried in this order on the first prompt:

- vLLM (and ``ttft serve``): ``POST /tokenize`` ``{"model", "prompt"}`` → ``{"count": n}``;
- llama-cpp-python: ``POST /extras/tokenize/count`` ``{"input"}`` → ``{"count": n}``;
- TGI: ``POST /tokenize`` ``{"inputs"}`` → a list with one object per token.

A dialect that answers with another status, a body that is not JSON or of another shape is
passed over for the next; a timeout or a broken connection ends the search (the server is
not answering, and asking again would only delay the run). Every tokenizer endpoint is
optional: no answer of any kind is an error, only a reason to keep approximate lengths.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Dialect:
    """One server family's token-counting endpoint.

    Attributes:
        name: how the run metadata and messages name it.
        path: the endpoint, appended to the base URL.
        body: the request body for a text and the model (None: not known).
        count: the token count in a decoded JSON answer; None when the answer has another
            shape.
    """

    name: str
    path: str
    body: Callable[[str, str | None], dict[str, Any]]
    count: Callable[[Any], int | None]


def _count_field(payload: Any) -> int | None:
    value = payload.get("count") if isinstance(payload, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def _token_list(payload: Any) -> int | None:
    if isinstance(payload, list) and all(isinstance(t, dict) and "id" in t for t in payload):
        return len(payload)
    return None


def _vllm_body(text: str, model: str | None) -> dict[str, Any]:
    return {"prompt": text} if model is None else {"model": model, "prompt": text}


DIALECTS: tuple[Dialect, ...] = (
    Dialect("vLLM /tokenize", "/tokenize", _vllm_body, _count_field),
    Dialect("llama-cpp-python /extras/tokenize/count", "/extras/tokenize/count",
            lambda text, model: {"input": text}, _count_field),
    Dialect("TGI /tokenize", "/tokenize", lambda text, model: {"inputs": text}, _token_list),
)
"""The dialects in the order they are tried."""


class TokenizerUnavailable(Exception):
    """The server counts no tokens for us; the message says why, in one line."""


class _Refused(TokenizerUnavailable):
    """This dialect is not the server's (another status or another shape of answer)."""


class ServerTokenizer:
    """Counts tokens through one server dialect, at most ``parallel`` calls at a time, each
    text once.

    Use :meth:`find` to pick the dialect the server speaks.
    """

    def __init__(self, client: httpx.AsyncClient, base_url: str, dialect: Dialect,
                 model: str | None, parallel: int = 8) -> None:
        self.client, self.dialect, self.model = client, dialect, model
        self.url = base_url.rstrip("/") + dialect.path
        self.gate = asyncio.Semaphore(parallel)
        self.cache: dict[str, int] = {}

    @classmethod
    async def find(cls, client: httpx.AsyncClient, base_url: str, text: str,
                   model: str | None, parallel: int = 8) -> ServerTokenizer:
        """The tokenizer of the first dialect (:data:`DIALECTS`) that counts ``text``.

        Raises:
            TokenizerUnavailable: none did; the message names what each one answered.
        """
        answers: list[str] = []
        for dialect in DIALECTS:
            tokenizer = cls(client, base_url, dialect, model, parallel)
            try:
                await tokenizer.count(text)
            except _Refused as exc:
                answers.append(str(exc))
                continue
            except TokenizerUnavailable as exc:
                answers.append(str(exc))
                break
            return tokenizer
        raise TokenizerUnavailable("; ".join(answers))

    async def count(self, text: str) -> int:
        """The server's token count of ``text``.

        Raises:
            TokenizerUnavailable: no count came back (the message names the dialect).
        """
        if text not in self.cache:
            async with self.gate:
                self.cache[text] = await self._ask(text)
        return self.cache[text]

    async def _ask(self, text: str) -> int:
        name = self.dialect.name
        try:
            response = await self.client.post(self.url, json=self.dialect.body(text, self.model))
        except httpx.TimeoutException:
            raise TokenizerUnavailable(
                f"{name}: no answer within {self.client.timeout.read:g} s") from None
        except httpx.HTTPError as exc:
            raise TokenizerUnavailable(f"{name}: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise _Refused(f"{name}: HTTP {response.status_code}")
        try:
            payload = response.json()
        except ValueError:
            raise _Refused(f"{name}: the answer is not JSON") from None
        n = self.dialect.count(payload)
        if n is None:
            raise _Refused(f"{name}: no token count in the answer")
        return n
