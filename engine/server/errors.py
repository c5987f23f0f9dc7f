"""The server's errors: ``APIError`` and OpenAI's error body
``{"error": {"message", "type", "param", "code"}}`` for it, for a request body that fails
validation (400, naming the field) and for Starlette's own HTTP errors (404, 405).

Every ``APIError`` answered counts in ``ttft:requests_total`` under its status's label
(the application's ``Metrics`` in ``app.state.ttft``)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["APIError", "add_error_handlers", "error_response", "validation_error"]

STATUS_LABEL = {400: "invalid", 401: "unauthorized", 404: "not_found", 429: "queue_full"}
"""The ``ttft:requests_total`` status of an answered error; ``error`` for other codes."""
_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "function-after"}


class APIError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        """OpenAI's error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def error_response(err: APIError) -> JSONResponse:
    """``err`` as a JSON response with its status and headers."""
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def validation_error(exc: RequestValidationError) -> APIError:
    """A 400 for a body that failed validation, naming the first bad field (``param``)."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request body")
    err = errors[0]
    loc = [str(x) for x in err.get("loc", ())]
    if err.get("type") == "json_invalid":
        return APIError(400, f"invalid JSON body: {err.get('ctx', {}).get('error', err['msg'])}")
    if loc and loc[0] == "body":
        loc = loc[1:]
    if not loc and err.get("type") in ("model_attributes_type", "dict_type", "missing"):
        return APIError(400, "the request body must be a JSON object")
    # a union adds its member's type to the location (``stop.list[str].0``): keep fields
    fields = [x for x in loc if x not in _TYPE_NAMES and "[" not in x and "-" not in x]
    param = ".".join(fields) or None
    where = param or "request body"
    return APIError(400, f"{where}: {err.get('msg', 'invalid')}", param=param)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    metrics = request.app.state.ttft.metrics
    metrics.requests(STATUS_LABEL.get(exc.status, "error")).inc()
    return error_response(exc)


async def _invalid_body(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return await _api_error(request, validation_error(exc))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(
        APIError(exc.status_code, str(exc.detail), type=kind, headers=exc.headers)
    )


def add_error_handlers(app: FastAPI) -> None:
    """Answer ``APIError``, failed validation and Starlette's HTTP errors with OpenAI's
    error body."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid_body)
    app.add_exception_handler(StarletteHTTPException, _http_error)
