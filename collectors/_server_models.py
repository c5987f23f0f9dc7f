"""Which model to trace: the server's ``GET /v1/models``, an optional endpoint like every
other but the completions. A server without a usable one is traced with the model the user
names; only when no model can be known is that an error, in one line."""

from __future__ import annotations

from typing import Any

import httpx


def server_models(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """The server's ``GET /v1/models`` answer (a JSON list is returned as ``{"data": list}``).

    Raises:
        ConnectionError: the server cannot be reached.
        LookupError: it can, but gives no model list (another status, a body that is not
            JSON, no answer within ``timeout_s``); the message says which, in one line.
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    where = url.rstrip("/") + "/v1/models"
    try:
        response = httpx.get(where, headers=headers, timeout=timeout_s)
    except (httpx.ConnectTimeout, httpx.ConnectError, httpx.UnsupportedProtocol) as exc:
        raise ConnectionError(f"{url}: cannot reach the server ({exc})") from None
    except httpx.TimeoutException:
        raise LookupError(f"{where}: no answer within {timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise LookupError(f"{where}: {type(exc).__name__}") from None
    if response.status_code != 200:
        body = " ".join(response.text.split())
        raise LookupError(f"{where}: HTTP {response.status_code}"
                          + (f" ({body[:120]})" if body else ""))
    try:
        out = response.json()
    except ValueError:
        raise LookupError(f"{where}: the answer is not JSON") from None
    return out if isinstance(out, dict) else {"data": out}


def choose_model(url: str, model: str | None, api_key: str | None = None,
                 timeout_s: float = 10.0) -> tuple[str, dict[str, Any]]:
    """The model to trace (``model``, else the server's first) and ``/v1/models``' answer
    (``{"error": why}`` when it gave none: then ``model`` is taken on trust).

    Raises:
        ConnectionError: the server is unreachable; or no model is known (``model`` is
            None and there is no model list, or an empty one); or the list lacks ``model``.
    """
    try:
        models = server_models(url, api_key, timeout_s)
    except LookupError as exc:
        if model is None:
            raise ConnectionError(f"{exc}: no model to ask for; pass --model") from None
        return model, {"error": str(exc)}
    data = models.get("data")
    ids = [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")] \
        if isinstance(data, list) else []
    chosen = model or (ids[0] if ids else None)
    if chosen is None:
        raise ConnectionError(f"{url}/v1/models lists no model; pass --model")
    if ids and chosen not in ids:
        raise ConnectionError(f"{url} does not serve {chosen!r} (it serves: {', '.join(ids)})")
    return chosen, models
