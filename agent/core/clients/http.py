"""HTTPClient: any OpenAI-compatible server (`resident serve`, SGLang, vLLM, hosted APIs).

Retries cover what is worth retrying, and only before the response has
started: connection failures, 429 and 503 (and the 502/504 a proxy in front
of a restarting server gives), with exponential backoff and jitter, honouring
`Retry-After`. Once text has streamed to the user a retry would repeat it, so
a stream that breaks mid-way is a `TransientError` for the caller to handle.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agent.core.clients.base import (
    AuthenticationError,
    BadResponseError,
    ChatRequest,
    ConfigurationError,
    ContextOverflowError,
    LLMClient,
    RequestRejected,
    StreamItem,
    TransientError,
)
from agent.core.clients.sse import ChatStreamDecoder, decode_complete_response, error_from_payload
from agent.core.valid_unicode import json_text

log = logging.getLogger(__name__)
# vLLM's and SGLang's answer to tools when the server was started without a tool parser.
_TOOLS_OFF = re.compile(r"enable-auto-tool-choice|tool-call-parser", re.IGNORECASE)

RETRY_STATUS = frozenset({429, 502, 503, 504})
# The headers routers keep a session on one replica by (bind_session): vllm-router's
# consistent_hash and sticky_least_loaded policies hash the first of x-session-id,
# x-user-id, ... (before the body's `user`); sglang-router's manual policy (and SGLang's
# own routing-key scheduling) reads x-smg-routing-key, the only one of these it forwards.
SESSION_HEADERS = ("X-Session-Id", "X-SMG-Routing-Key")


def repository_key(workspace: Path) -> str:
    """The routing key of a repository (bind_session): one per workspace, so every
    session on it, and their subagents, go to the replica that caches its snapshot;
    a key per session would spread one repository's sessions over the replicas and
    make each pay for the repository's prefill (measured: docs/SCALING.md)."""
    digest = hashlib.sha256(str(Path(workspace).resolve()).encode()).hexdigest()
    return f"repo-{digest[:24]}"


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5  # requests in all, the first one included
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    max_retry_after_s: float = 30.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), self.max_retry_after_s)
            except ValueError:
                pass  # an HTTP date; fall back to backoff
        backoff = min(self.base_delay_s * (2**attempt), self.max_delay_s)
        return backoff * (0.5 + random.random() / 2)


DEFAULT_RETRY = RetryPolicy()


def default_timeout() -> httpx.Timeout:
    # `read` is the longest silence between two chunks: a long prompt's prefill
    # on a busy server comes before the first byte, so it is generous.
    return httpx.Timeout(connect=10.0, read=600.0, write=60.0, pool=30.0)


def api_root(url: str) -> str:
    """`http://host:8000`, `http://host:8000/` and `http://host:8000/v1` all mean one server."""
    root = url.strip().rstrip("/")
    if not root.startswith(("http://", "https://")):
        root = "http://" + root
    return root[: -len("/v1")] if root.endswith("/v1") else root


# Failures before any answer came back: the request can be sent again. A pooled
# keep-alive connection the server has closed meanwhile (after a long tool call, past
# the server's keep-alive timeout) fails as RemoteProtocolError, or as a ReadError or
# WriteError (connection reset) depending on when the close is seen.
_NO_ANSWER_YET = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
)


class HTTPClient(LLMClient):
    token_count_method = "estimate"

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        context_window: int | None = None,
        retry: RetryPolicy | None = None,
        timeout: httpx.Timeout | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = api_root(url)
        self.model = model or ""
        self.configured_window = context_window
        self.retry = retry or DEFAULT_RETRY
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.AsyncClient(
            base_url=self.url + "/v1",
            headers=headers,
            timeout=timeout or default_timeout(),
            transport=transport,
        )
        self._window: int | None = None
        self._listing: list[dict[str, Any]] | None = None
        self.session_key: str | None = None

    def describe(self) -> str:
        return f"{self.model} at {self.url}"

    def bind_session(self, key: str) -> None:
        """Send `key` with every generation request, in the headers routers hash on
        (SESSION_HEADERS). A routing hint only: servers do not split the cache by it."""
        self.session_key = key or None

    def _session_headers(self) -> dict[str, str]:
        key = self.session_key
        return {name: key for name in SESSION_HEADERS} if key else {}

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- requests with retries -----------------------------------------------------

    async def _send(self, method: str, path: str, *, stream: bool, **kwargs: Any) -> httpx.Response:
        """The response (open, when streaming) once it is not a retryable failure."""
        last_problem = ""
        retry_after: str | None = None
        for attempt in range(self.retry.attempts):
            if attempt:
                await asyncio.sleep(self.retry.delay(attempt - 1, retry_after))
            retry_after = None
            try:
                request = self._http.build_request(method, path, **kwargs)
                response = await self._http.send(request, stream=stream)
            except _NO_ANSWER_YET as err:
                last_problem = f"cannot reach {self.url} ({type(err).__name__}: {err})"
                log.info("attempt %d: %s", attempt + 1, last_problem)
                continue
            except httpx.TimeoutException as err:
                raise TransientError(f"{self.url} did not answer in time ({err})") from err
            if response.status_code not in RETRY_STATUS:
                return response
            retry_after = response.headers.get("retry-after")
            body = await _read_body(response)
            last_problem = f"{self.url} is overloaded (HTTP {response.status_code}: {body[:200]})"
            log.info("attempt %d: %s", attempt + 1, last_problem)
        raise TransientError(f"{last_problem}; gave up after {self.retry.attempts} attempts")

    async def _check(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        body = await _read_body(response)
        if response.status_code in (401, 403):
            raise AuthenticationError(
                f"{self.url} rejected the API key (HTTP {response.status_code}); pass the right "
                "one with --api-key or RESIDENT_API_KEY"
            )
        try:
            error = json.loads(body).get("error", body)
        except (ValueError, AttributeError, RecursionError):
            error = body[:500]
        problem = error_from_payload(error, response.status_code)
        if isinstance(problem, TransientError | ContextOverflowError):
            raise problem
        if _TOOLS_OFF.search(str(problem)):
            raise ConfigurationError(
                f"{self.url} does not parse tool calls, and the agent works through them: "
                "start vLLM with --enable-auto-tool-choice --tool-call-parser PARSER (kimi_k2, "
                "glm45, hermes, ... for the model), or SGLang with --tool-call-parser PARSER "
                f"(the server said: {problem})"
            )
        raise RequestRejected(f"HTTP {response.status_code} from {self.url}: {problem}")

    async def _get_json(self, path: str) -> Any:
        response = await self._send("GET", path, stream=False)
        await self._check(response)
        try:
            return response.json()
        except ValueError:
            raise BadResponseError(f"GET {path} on {self.url} did not return JSON") from None

    # -- the interface ---------------------------------------------------------------

    async def _models(self) -> list[dict[str, Any]]:
        """The entries of GET /v1/models (asked once: the model and its length come from it)."""
        if self._listing is None:
            listing = await self._get_json("/models")
            models = listing.get("data") if isinstance(listing, dict) else None
            self._listing = [m for m in models or [] if isinstance(m, dict)]
        return self._listing

    async def resolve_model(self) -> str:
        """The model to ask for: the configured one, else the first the server lists."""
        if self.model:
            return self.model
        models = await self._models()
        if not models or not models[0].get("id"):
            raise ConfigurationError(f"{self.url} lists no models; name one with --model")
        self.model = str(models[0]["id"])
        return self.model

    async def context_window(self) -> int:
        if self._window is not None:
            return self._window
        published = await self._published_window()
        windows = [w for w in (published, self.configured_window) if w]
        if not windows:
            raise ConfigurationError(
                f"{self.url} publishes neither /v1/engine/stats nor max_model_len in /v1/models, "
                "so the context window is unknown; pass it with --context-window N "
                "(tokens per request)"
            )
        # The configured value may narrow what the server offers, never widen it.
        self._window = min(windows)
        return self._window

    async def _published_window(self) -> int | None:
        """What the server says one request may hold: `resident serve`'s stats, else the
        `max_model_len` vLLM and SGLang list for each model in /v1/models, else the one
        a router's workers give in /get_model_info (below)."""
        stats_window = await self._stats_window()
        if stats_window is not None:
            return stats_window
        listed = await self._listed_window()
        return listed if listed is not None else await self._model_info_window()

    async def _stats_window(self) -> int | None:
        response = await self._send("GET", "/engine/stats", stream=False)
        if response.status_code in (404, 405, 501):
            await response.aclose()
            return None
        await self._check(response)
        try:
            stats = response.json()
            sizes = [
                int(stats[k]) for k in ("max_context_tokens", "capacity_tokens") if stats.get(k)
            ]
        except (ValueError, TypeError, AttributeError):
            return None
        return min(sizes) if sizes else None

    async def _listed_window(self) -> int | None:
        try:
            models = await self._models()
        except (RequestRejected, BadResponseError):
            return None  # no usable listing: the flag must say it
        # The entry of the model we ask for; a server with one model lists it first.
        named = [m for m in models if self.model and m.get("id") == self.model]
        for entry in named or models[:1]:
            value = entry.get("max_model_len")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    async def _model_info_window(self) -> int | None:
        """`max_model_len` in the worker facts a router passes through: sglang-router
        lists no length in /v1/models and keeps /v1/engine/stats, but hands
        /get_model_info to a worker (`resident serve` answers it with the length)."""
        response = await self._send("GET", self.url + "/get_model_info", stream=False)
        if response.status_code >= 400:
            await response.aclose()
            return None
        try:
            value = response.json().get("max_model_len")
        except (ValueError, AttributeError, RecursionError):
            return None
        valid = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return value if valid else None

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamItem]:
        await self.resolve_model()
        body: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = request.tools
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        # Encoded here rather than by httpx (`json=`), which raises on a lone surrogate:
        # the history carries file names and tool output too, and one such character
        # must not cost every later request (agent/core/valid_unicode.py).
        content = json_text(body, separators=(",", ":"), allow_nan=False).encode("utf-8")
        response = await self._send(
            "POST",
            "/chat/completions",
            stream=True,
            content=content,
            headers={"Content-Type": "application/json", **self._session_headers()},
        )
        try:
            await self._check(response)
            if "text/event-stream" not in response.headers.get("content-type", "text/event-stream"):
                for item in decode_complete_response(await _read_json(response)):
                    yield item
                return
            decoder = ChatStreamDecoder()
            try:
                async for line in response.aiter_lines():
                    for item in decoder.feed_line(line):
                        yield item
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ReadTimeout) as err:
                raise TransientError(
                    f"the connection to {self.url} broke mid-response: {err}"
                ) from err
            for item in decoder.finish():
                yield item
        finally:
            await response.aclose()


async def _read_body(response: httpx.Response) -> str:
    try:
        await response.aread()
        return response.text
    except httpx.HTTPError:
        return ""
    finally:
        await response.aclose()


async def _read_json(response: httpx.Response) -> dict[str, Any]:
    text = await _read_body(response)
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested absurdly deep
        raise BadResponseError(
            f"the server answered with something that is not JSON: {text[:200]!r}"
        ) from None
    if not isinstance(body, dict):
        raise BadResponseError(
            f"the server answered with a JSON {type(body).__name__}, not an object"
        )
    return body
