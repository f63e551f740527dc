"""The one interface through which the agent talks to a model.

A client takes a chat request (OpenAI-shaped messages plus tool schemas) and
streams back what the model produced, already split into text, reasoning and
complete tool calls (in the engine's words for them, below), and ends with a
`Completion` carrying the usage. Two implementations: `LocalClient` over the
in-process engine and `HTTPClient` for any OpenAI-compatible server. The agent
imports nothing else from the engine side.

Errors are typed by what the user should do about them, and each carries the
exit code headless runs end with (DESIGN.md §2).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.chat.events import ContentDelta, ReasoningDelta, ToolCall, ToolCallError

# -- requests ------------------------------------------------------------------


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float | None = None
    # How many leading messages form the resident prefix (system prompt and
    # snapshot); the local client pins their tokens in the prefix cache.
    pinned_messages: int = 0


# -- what a stream yields ------------------------------------------------------
#
# Streamed model output has one vocabulary from the engine to the front ends: the
# engine's (engine/chat/events.py). A client yields its pieces, with a tool call
# only once complete, and ends with a `Completion`; the loop turns each into the
# agent's event (agent/core/loop.py, `_generate`), which front ends and journals
# see as JSON. The whole mapping, in one place:
#
#   model output    engine parsers      client stream     agent event (JSON `type`)
#   answer text     ContentDelta        ContentDelta      TextDelta ("text_delta")
#   thinking text   ReasoningDelta      ReasoningDelta    ReasoningDeltaEvent ("reasoning_delta")
#   a tool call     ToolCallDelta...    ToolCall          ToolCallEvent ("tool_call")
#                   ToolCallEnd         (when complete)
#   bad call markup ToolCallError       ToolCallError     ErrorEvent ("error", kind
#                                                         "tool_call") and a note to the
#                                                         model, when no call came with it
#   the end         (finish reason)     Completion        Usage, TurnCompleted
#
# The HTTP client reads an OpenAI stream into the same items: `delta.content`,
# `reasoning_content` (or `reasoning`) and `tool_calls` (agent/core/clients/sse.py).
# A ToolCallError from a client names no call (`index` None): the client yields
# calls only once complete, so none it announced can be voided.


@dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None  # None when the server does not report it


@dataclass(frozen=True)
class Completion:
    finish_reason: str  # stop, length, tool_calls, ...
    usage: TokenUsage | None = None


StreamItem = ContentDelta | ReasoningDelta | ToolCall | ToolCallError | Completion


# -- errors --------------------------------------------------------------------


class ClientError(Exception):
    """A request could not be served. `kind` says why, for events and exit codes."""

    kind = "client"


class TransientError(ClientError):
    """Unreachable, overloaded or cut off: trying again later may work."""

    kind = "transient"


class AuthenticationError(ClientError):
    """The server rejected the API key."""

    kind = "authentication"


class RequestRejected(ClientError):
    """The server refused this request (a 4xx other than auth and rate limits)."""


class ContextOverflowError(RequestRejected):
    """The prompt does not fit the model's context window."""

    kind = "context"


class BadResponseError(ClientError):
    """The server answered with something that is not an OpenAI response."""


class EngineFailure(ClientError):
    """The in-process engine failed while generating."""

    kind = "engine"


class ConfigurationError(ClientError):
    """Something the user must set is missing or wrong (e.g. the context window)."""

    kind = "configuration"


# -- the interface -------------------------------------------------------------

TokenCountMethod = Literal["tokenizer", "estimate"]
# Remote servers do not expose their tokenizer; code and English prose run at
# 3.5 to 4.5 characters per token with the BPE vocabularies we serve, so three
# characters per token over-counts a little, which keeps budgets on the safe side.
ESTIMATED_CHARS_PER_TOKEN = 3.0


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / ESTIMATED_CHARS_PER_TOKEN)


class LLMClient(ABC):
    model: str
    token_count_method: TokenCountMethod = "estimate"

    @abstractmethod
    async def context_window(self) -> int:
        """Tokens one request may hold (prompt plus output). Raises ConfigurationError
        when neither the server nor the configuration says; it is never guessed."""

    @abstractmethod
    def stream(self, request: ChatRequest) -> AsyncIterator[StreamItem]:
        """The model's answer as it is produced; the last item is a `Completion`.
        Leaving the iteration early (or cancelling the task) stops generation."""

    def count_tokens(self, text: str) -> int:
        """Tokens `text` takes in a prompt, by `token_count_method`."""
        return estimate_tokens(text)

    def describe(self) -> str:
        return self.model

    def bind_session(self, key: str) -> None:  # noqa: B027 - only a remote client routes
        """Name the routing key every later request carries (the repository's: one
        replica behind a router then holds its resident prefix for every session on
        it). HTTPClient sends it; the in-process engine has nothing to route.
        Subagents share the client, and so the key, as they share the prefix."""

    async def aclose(self) -> None:  # noqa: B027 - most clients hold nothing to release
        """Release connections or the engine."""
