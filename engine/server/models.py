"""The server's request bodies (pydantic models, strict types, unknown fields allowed as
OpenAI's API allows them) and its response bodies (OpenAI's completion and chat shapes,
whole or as stream chunks).

Every text field must be valid Unicode (JSON's ``\\ud800`` escape makes a lone surrogate,
which no UTF-8 tokenizer can take): otherwise the body fails validation (400). ``stop``
holds at most ``MAX_STOPS`` strings (OpenAI's limit) of at most ``MAX_STOP_CHARS``
characters each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)

__all__ = [
    "MAX_STOPS",
    "MAX_STOP_CHARS",
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "Response",
    "SamplingRequest",
    "StreamOptions",
    "Text",
    "TextPart",
    "TokenizeRequest",
    "chat_prompt",
]

StrictFloat = Annotated[float, Strict()]
MAX_STOPS = 4
"""The most stop strings a request may carry (OpenAI's limit)."""
MAX_STOP_CHARS = 256
"""The longest stop string, in characters: bounds the text held back and searched per token."""


def _valid_unicode(text: str) -> str:
    """``text`` when it encodes as UTF-8; a lone surrogate is refused, naming its index."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"text is not valid Unicode: {e.reason} at index {e.start}") from None
    return text


Text = Annotated[StrictStr, AfterValidator(_valid_unicode)]
"""A strict string that is valid Unicode."""


# -- request bodies --------------------------------------------------------------------


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class SamplingRequest(BaseModel):
    """The fields completions and chat completions share."""

    model_config = ConfigDict(extra="allow")
    model: Text
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    seed: StrictInt | None = None
    stop: Text | list[Text] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(default=1, ge=1, le=1)

    @field_validator("stop")
    @classmethod
    def _bounded_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        longest = max((len(s) for s in stops), default=0)
        if longest > MAX_STOP_CHARS:
            raise ValueError(f"a stop string is at most {MAX_STOP_CHARS} characters, got {longest}")
        return stop

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def stops(self) -> list[str]:
        """The stop strings, as a list."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingRequest):
    prompt: Text | list[StrictInt]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Text = "text"
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Text
    content: Text | list[TextPart] | None = None


class ChatRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    prompt: Text
    model: Text | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    tokens: list[StrictInt]
    model: Text | None = None


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
