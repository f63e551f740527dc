"""The Anthropic Messages API's request bodies, as pydantic models, and its error body.

Field names, types and ranges follow Anthropic's API reference, so a request
the official SDK (or Claude Code) sends validates here and a bad one is a 400
naming the field. Unknown fields are ignored (`cache_control`, `citations`,
`container`, `service_tier`, ... have no meaning on this server), and content
blocks of a type this server cannot use still validate, as `OtherBlock`, so
that the translation can refuse them with a message saying why rather than a
schema error listing every type it expected.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Lenient):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Lenient):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class ThinkingBlock(_Lenient):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Lenient):
    type: Literal["redacted_thinking"]
    data: str = ""


class OtherBlock(BaseModel):
    """A block of a type the server knows of but cannot use (image, document, server tools)."""

    model_config = ConfigDict(extra="allow")

    type: str


# The block types validated by their own model; any other is an OtherBlock.
BLOCK_TAGS = frozenset({"text", "tool_use", "tool_result", "thinking", "redacted_thinking"})


def _block_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in BLOCK_TAGS else "other"


class ToolResultBlock(_Lenient):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ContentBlock] | None = None
    is_error: bool = False


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_tag),
]
ToolResultBlock.model_rebuild()


class InputMessage(_Lenient):
    # Claude Code sends reminders as "system" turns between the others.
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(_Lenient):
    # Server tools (web search, code execution, ...) name a versioned `type`;
    # client tools have none or "custom". The translation refuses the former.
    type: str | None = None
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _named(self):
        if self.type == "tool" and not self.name:
            raise ValueError('tool_choice of type "tool" needs the tool\'s name')
        return self


class ThinkingConfig(_Lenient):
    # "adaptive" lets the model decide, which here means the template's default.
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)


class OutputFormat(_Lenient):
    """Structured output: the answer is JSON valid against `schema`."""

    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Lenient):
    format: OutputFormat | None = None
    effort: str | None = None  # no effort levels here: accepted, no effect


class Conversation(_Lenient):
    """What a Messages request and a count_tokens request share: the prompt."""

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(Conversation):
    max_tokens: int = Field(ge=1)
    stream: bool = False
    temperature: float = Field(default=1.0, ge=0, le=1, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=0, le=2**31 - 1)  # 32-bit, as on chat
    stop_sequences: list[str] | None = None
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the beta's name for output_config.format

    @property
    def structured_output(self) -> OutputFormat | None:
        return self.output_format or (self.output_config and self.output_config.format)


ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
]


def error_body(type: str, message: str) -> dict[str, Any]:
    """Anthropic's error object, the body of every failed Messages API response.

    `type` is one of ErrorType (a plain str here so an APIError's type passes as is)."""
    return {"type": "error", "error": {"type": type, "message": message}}
