"""The server's request bodies (pydantic models, strict types, unknown fields allowed as
OpenAI's API allows them) and its response bodies (OpenAI's completion and chat shapes,
whole or as stream chunks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, StrictStr

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "Response",
    "SamplingRequest",
    "StreamOptions",
    "TextPart",
    "TokenizeRequest",
    "chat_prompt",
]

StrictFloat = Annotated[float, Strict()]


# -- request bodies --------------------------------------------------------------------


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class SamplingRequest(BaseModel):
    """The fields completions and chat completions share."""

    model_config = ConfigDict(extra="allow")
    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(default=1, ge=1, le=1)

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def stops(self) -> list[str]:
        """The stop strings, as a list."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingRequest):
    prompt: StrictStr | list[StrictInt]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: StrictStr = "text"
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: StrictStr | list[TextPart] | None = None


class ChatRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    prompt: StrictStr
    model: StrictStr | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    tokens: list[StrictInt]
    model: StrictStr | None = None


def chat_prompt(messages: Sequence[ChatMessage]) -> str:
    """``"role: content\\n"`` per message, then ``"assistant:"``."""
    lines = []
    for m in messages:
        content = m.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        lines.append(f"{m.role}: {content or ''}\n")
    return "".join(lines) + "assistant:"


# -- response bodies -------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    """The body of one response: a completion (``chat`` False) or a chat completion,
    whole or as stream chunks, with one choice (``n`` is 1)."""

    id: str
    created: int
    model: str
    chat: bool

    def whole(self, text: str, finish_reason: str | None, usage: Any) -> dict[str, Any]:
        """The non-streamed body."""
        if self.chat:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish_reason
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }

    def chunk(
        self, choices: list[dict[str, Any]], include_usage: bool, **extra: Any
    ) -> dict[str, Any]:
        """One stream chunk; ``usage`` is null in each when the stream ends with usage."""
        payload: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if include_usage:
            payload["usage"] = None
        payload.update(extra)
        return payload

    def choice(
        self, text: str | None, finish_reason: str | None, role: bool = False
    ) -> dict[str, Any]:
        """A stream chunk's choice: the text (completions) or a delta with the content and,
        for the first chat chunk (``role``), the assistant role."""
        if not self.chat:
            return {
                "index": 0,
                "text": text or "",
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
