"""The OpenAI Responses API's request body and the response object, as this server speaks them.

The request is kept loose where OpenAI's is a wide union (input items,
tools, `text.format`): responses_input.py walks those by hand so that an
unsupported part is a 400 that names it (`input.2.content.0`), instead of a
pydantic union error listing every alternative. Unknown fields are ignored,
as Codex and the SDK send fields this server has no use for
(`prompt_cache_key`, `text.verbosity`, `service_tier`, ...).

The response object is a plain dict, built once per request by
`response_shell` and completed by responses_stream.py; its field set is what
the `openai` SDK's `Response` model reads.
"""

from __future__ import annotations

import base64
import binascii
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Extensions a Responses request may carry and that mean the same as on
# /v1/chat/completions (the vLLM/SGLang ones), passed through unchanged.
CHAT_EXTENSIONS = (
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "cache_salt",
    "chat_template_kwargs",
)

# Reasoning handed back to stateless clients (`include: ["reasoning.encrypted_content"]`,
# as Codex asks with `store: false`) is this prefix and the text in base64. It is
# not encrypted: the client holds its own conversation anyway; the field only
# lets the reasoning survive a client that drops raw reasoning text when it
# sends the history back.
REASONING_TOKEN_PREFIX = "resident.reasoning.v1:"
INCLUDE_REASONING_TOKEN = "reasoning.encrypted_content"


class ResponsesRequest(BaseModel):
    # "allow" rather than "ignore": CHAT_EXTENSIONS are read from the extras.
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    stream: bool = False
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None

    @model_validator(mode="after")
    def _reject_unsupported(self):
        if self.background:
            raise ValueError("background responses are not supported by this server")
        if self.conversation is not None:
            raise ValueError(
                "conversations are not supported by this server; "
                "chain responses with previous_response_id or send the whole input"
            )
        if self.input is None and self.previous_response_id is None:
            raise ValueError("input is required")
        return self

    @property
    def stores(self) -> bool:
        """OpenAI stores responses unless told not to."""
        return self.store is not False

    @property
    def wants_reasoning_token(self) -> bool:
        return INCLUDE_REASONING_TOKEN in (self.include or [])

    def extensions(self) -> dict[str, Any]:
        extra = self.model_extra or {}
        return {key: extra[key] for key in CHAT_EXTENSIONS if extra.get(key) is not None}


def new_id(prefix: str) -> str:
    """OpenAI-style ids: `resp_...`, `msg_...`, `rs_...`, `fc_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


def encode_reasoning(text: str) -> str:
    return REASONING_TOKEN_PREFIX + base64.b64encode(text.encode()).decode()


def decode_reasoning(token: Any) -> str | None:
    """The text of a token from encode_reasoning; None for anything else (e.g. OpenAI's own)."""
    if not isinstance(token, str) or not token.startswith(REASONING_TOKEN_PREFIX):
        return None
    try:
        return base64.b64decode(token[len(REASONING_TOKEN_PREFIX) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def usage(input_tokens: int, cached: int, output_tokens: int, reasoning_tokens: int) -> dict:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def response_shell(
    request: ResponsesRequest,
    response_id: str,
    model_id: str,
    tools: list[dict[str, Any]],
    text_format: dict[str, Any],
) -> dict[str, Any]:
    """The response object as it stands before any output: status in_progress.

    It echoes the request's settings (with OpenAI's defaults filled in), as
    OpenAI's does, so a client can read back what was applied.
    """
    reasoning = request.reasoning or {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": model_id,
        "output": [],
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": request.stores,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "text": {"format": text_format},
        "tool_choice": request.tool_choice or "auto",
        "tools": tools,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "truncation": request.truncation or "disabled",
        "usage": None,
        "user": request.user,
        "metadata": request.metadata or {},
    }
