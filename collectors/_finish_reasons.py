"""What a stream's finish reason says about its request (docs/attribution.md, "Outcomes from
the stream's end"; private to ``collectors``).

Sources: OpenAI's API reference (chat completion and completion objects, ``finish_reason``:
``stop``, ``length``, ``tool_calls``, ``function_call``, ``content_filter``); vLLM's
OpenAI-compatible server (``vllm/entrypoints/openai``), which ends an aborted request's
stream with ``"abort"`` (and a failed one with ``"error"``); SGLang, whose finish reason is
an object (``{"type": "stop" | "length" | "abort", ...}``, its ``FINISH_*`` classes'
``to_json``) that reaches a client as one when the request was aborted.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["ABORTED", "Finish", "finish_of"]

OK_REASONS = frozenset(("stop", "length", "tool_calls", "function_call", "content_filter"))
"""Finish reasons of an answer the server completed (OpenAI's API reference)."""
ABORT_REASONS = frozenset(("abort", "error"))
"""Finish reasons of an answer the server gave up on (vLLM: ``abort``, ``error``)."""
OBJECT_OK_TYPES = frozenset(("stop", "length"))
"""``type`` values of an object-valued finish reason that completed (SGLang's
``FINISH_MATCHED_TOKEN``/``FINISH_MATCHED_STR`` and ``FINISH_LENGTH``)."""
ABORTED = "aborted"
"""The outcome of a request whose stream ended with a failing finish reason."""


class Finish(NamedTuple):
    """One finish reason read: ``reason`` as the client span records it (an object's
    ``type``, else ``"object"``), ``failed`` when it makes the request ``aborted``, and
    ``known`` false for a string reason no source defines (kept ``ok``)."""

    reason: str
    failed: bool
    known: bool
    message: str | None = None


def finish_of(value: Any) -> Finish | None:
    """The finish reason of one choice; None when it carries none (null, empty)."""
    if not value:
        return None
    if isinstance(value, dict):
        kind = value.get("type")
        reason = kind if isinstance(kind, str) and kind else "object"
        message = value.get("message")
        return Finish(reason, reason not in OBJECT_OK_TYPES, True,
                      str(message) if message is not None else None)
    reason = str(value)
    failed = reason in ABORT_REASONS
    return Finish(reason, failed, failed or reason in OK_REASONS)
