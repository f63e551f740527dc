"""Reading a request body into a pydantic model, for every API the server speaks.

One reader, so the size cap, client disconnects, bad JSON and JSON of a
bad shape (nested deeper than MAX_JSON_DEPTH, a number that is not finite:
engine.chat.json_limits) are handled alike on /v1/chat/completions,
/v1/completions, /v1/responses and /v1/messages; only how field errors are
worded differs per API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from engine.chat.json_limits import JsonShapeError, loads_bounded
from engine.server.error_responses import (
    APIError,
    ClientDisconnected,
    bad_request,
    from_validation_error,
)

# A request body larger than this is refused before it is parsed.
MAX_BODY_BYTES = 32 * 1024 * 1024


async def parse_body(
    request: Request,
    model: type[BaseModel],
    *,
    max_bytes: int = MAX_BODY_BYTES,
    on_invalid: Callable[[ValidationError], APIError] = from_validation_error,
) -> Any:
    """The JSON body as `model`: 413 for a huge body (checked before reading when the
    client says its length), 400 for bad JSON, JSON nested too deeply or holding a
    number that is not finite (named by its path), a non-object, or bad fields."""
    too_large = APIError(413, f"request body over {max_bytes} bytes", code="body_too_large")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise too_large
    try:
        raw = await request.body()
    except ClientDisconnect as error:
        raise ClientDisconnected() from error
    if len(raw) > max_bytes:
        raise too_large
    try:
        data = loads_bounded(raw)
    except JsonShapeError as error:
        raise bad_request(f"the request body is refused: {error}", param=error.path) from error
    except (ValueError, UnicodeDecodeError) as error:
        raise bad_request(f"the request body is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise on_invalid(error) from error
