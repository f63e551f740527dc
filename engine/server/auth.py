"""API-key checking and the cache salt that follows from the key.

With a key configured, every route but /health needs `Authorization: Bearer
KEY` or, as Anthropic's clients send it, `x-api-key: KEY`; the check is a
pure ASGI middleware so that it runs before routing and body parsing (an
unauthenticated client learns nothing, not even whether its JSON was valid).
The comparison is constant-time (hmac.compare_digest) so the key cannot be
guessed byte by byte from response times.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from engine.server.anthropic_protocol import error_body

OPEN_PATHS = frozenset({"/health"})
# Routes of the Anthropic Messages API, whose clients expect its own error shape.
ANTHROPIC_PREFIX = "/v1/messages"


def _unauthorized_body(message: str, path: str) -> bytes:
    if path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/"):
        return json.dumps(error_body("authentication_error", message)).encode()
    error = {"message": message, "type": "authentication_error", "param": None, "code": None}
    return json.dumps({"error": {**error, "code": "invalid_api_key"}}).encode()


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.expected_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        presented = headers.get(b"authorization", b"")
        presented_key = headers.get(b"x-api-key", b"")
        # Both compared, always, so the time taken says nothing about either.
        bearer_ok = hmac.compare_digest(presented, self.expected)
        key_ok = hmac.compare_digest(presented_key, self.expected_key)
        if bearer_ok or key_ok:
            await self.app(scope, receive, send)
            return
        message = "missing API key" if not (presented or presented_key) else "invalid API key"
        body = _unauthorized_body(
            f"{message}: send the header `Authorization: Bearer <key>` (or `x-api-key: <key>`) "
            "with the server's key",
            scope.get("path", ""),
        )
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def key_salt(api_key: str | None) -> str:
    """The cache salt of one API key: a hash, so the key itself never reaches the engine."""
    if not api_key:
        return ""
    return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:32]


def cache_salt(api_key: str | None, requested: str | None) -> str:
    """The salt a request's prefixes are cached under.

    Per API key by default, so one tenant cannot time another's cached
    prompts; a request's own `cache_salt` narrows that further (it is joined
    to the key's salt, never replaces it). No key and no salt: "" (shared).
    """
    base = key_salt(api_key)
    if not requested:
        return base
    return f"{base}|salt:{requested}" if base else f"salt:{requested}"
