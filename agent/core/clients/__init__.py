"""The one module through which the agent reaches a model (DESIGN.md §1).

`LocalClient` drives the in-process engine, `HTTPClient` any OpenAI-compatible
server; both speak `LLMClient` and stream the engine's words for model output
(`ContentDelta`, `ReasoningDelta`, `ToolCall`, `ToolCallError`: base.py maps
them to the agent's events), and the agent reads every stream through
`valid_stream` (valid Unicode, whatever a client sends). Of the engine, attach
mode loads only that pure-Python vocabulary (engine/chat); the engine itself is
imported only when a local client is made, so attach mode never loads torch.
"""

from agent.core.clients.base import (
    AuthenticationError,
    BadResponseError,
    ChatRequest,
    ClientError,
    Completion,
    ConfigurationError,
    ContentDelta,
    ContextOverflowError,
    EngineFailure,
    LLMClient,
    ReasoningDelta,
    RequestRejected,
    StreamItem,
    TokenUsage,
    ToolCall,
    ToolCallError,
    TransientError,
    estimate_tokens,
)
from agent.core.clients.http import HTTPClient, RetryPolicy
from agent.core.clients.valid_stream import valid_stream


def start_local_client(model: str | None = None, **engine_config) -> LLMClient:
    """A LocalClient with its own engine for `model` (None: the engine's default model);
    raises the engine's errors (a missing model names `resident models pull`)."""
    from agent.core.clients.local import LocalClient

    return LocalClient.start(model, **engine_config)


__all__ = [
    "AuthenticationError",
    "BadResponseError",
    "ChatRequest",
    "ClientError",
    "Completion",
    "ConfigurationError",
    "ContextOverflowError",
    "EngineFailure",
    "HTTPClient",
    "LLMClient",
    "ContentDelta",
    "ReasoningDelta",
    "RequestRejected",
    "RetryPolicy",
    "StreamItem",
    "TokenUsage",
    "ToolCall",
    "ToolCallError",
    "TransientError",
    "estimate_tokens",
    "start_local_client",
    "valid_stream",
]
