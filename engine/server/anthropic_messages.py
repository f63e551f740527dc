"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API on the same engine.

A Messages request is translated into the server's chat request
(anthropic_translate), rendered, sampled and parsed exactly as
/v1/chat/completions does it, and the parsed output folded into content
blocks (anthropic_blocks), returned whole or streamed (anthropic_stream).
Every failure is answered in Anthropic's error shape, `{"type": "error",
"error": {"type", "message"}}`, with the status codes the anthropic SDK maps
to its typed exceptions (an overloaded engine is 529, as Anthropic's own).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from engine.server.anthropic_blocks import ContentBlocks
from engine.server.anthropic_protocol import (
    BLOCK_TAGS,
    Conversation,
    ErrorType,
    MessagesRequest,
    error_body,
)
from engine.server.anthropic_stream import anthropic_sse_response, message_body, message_events
from engine.server.anthropic_translate import stop_reason, to_chat_request, usage
from engine.server.chat_rendering import render_chat
from engine.server.context import ServerContext
from engine.server.error_responses import APIError, bad_request, from_exception
from engine.server.generation import GenerationGroup, Job, unless_disconnected
from engine.server.request_body import parse_body
from engine.server.request_sampling import context_limit, output_budget, sampling_params

# Model names that stand for the served model (see served_name).
CLAUDE_PREFIX = "claude-"
# Anthropic's status for an overloaded service; the SDK raises OverloadedError and retries it.
OVERLOADED_STATUS = 529
_TYPES_BY_STATUS: dict[int, ErrorType] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
# Where pydantic's error locations name a union member rather than a field.
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|[\w-]+\[.*\])$")
# What pydantic puts before the message of a ValueError raised in a validator.
_VALUE_ERROR = "Value error, "


def anthropic_error(error: BaseException) -> APIError:
    """Any failure as an APIError carrying Anthropic's error type and status."""
    api_error = from_exception(error)
    if api_error.type == "server_overloaded":
        kind: ErrorType = "overloaded_error"
        status = OVERLOADED_STATUS
    else:
        status = api_error.status
        kind = _TYPES_BY_STATUS.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
    message = api_error.message
    if api_error.param and api_error.param not in message:
        # Anthropic's error has no `param` field: the path goes into the message.
        message = f"{api_error.param}: {message}"
    return APIError(status, message, type=kind, headers=api_error.headers)


def error_response(error: BaseException) -> JSONResponse:
    api_error = anthropic_error(error)
    return JSONResponse(
        error_body(api_error.type, api_error.message),
        status_code=api_error.status,
        headers=api_error.headers,
    )


def stream_error(error: BaseException) -> dict[str, Any]:
    api_error = anthropic_error(error)
    return error_body(api_error.type, api_error.message)


def _location(loc: tuple) -> str:
    parts: list[str] = []
    previous = None
    for part in loc:
        union_member = isinstance(part, str) and _UNION_MEMBER.match(part)
        # A block's index is followed by the tag its type selected, then its fields.
        block_tag = isinstance(previous, int) and part in (*BLOCK_TAGS, "other")
        if not union_member and not block_tag:
            parts.append(str(part))
        previous = part
    return ".".join(parts)


def validation_message(error: ValidationError) -> str:
    """Every problem, each named by its field path; a union member that failed only because
    the value had the other member's shape (a list where `str` was tried) is left out."""
    problems = [(_location(p.get("loc", ())), p) for p in error.errors()]
    messages = []
    for path, problem in problems:
        shape_only = problem.get("type", "").endswith("_type") and any(
            other.startswith(path + ".") for other, _ in problems
        )
        if not shape_only:
            text = problem.get("msg", "invalid value").removeprefix(_VALUE_ERROR)
            messages.append(f"{path}: {text}" if path else text)
    return "; ".join(dict.fromkeys(messages)) or "invalid request body"


async def _parse(request: Request, model: type[BaseModel], max_body_bytes: int) -> Any:
    return await parse_body(
        request,
        model,
        max_bytes=max_body_bytes,
        on_invalid=lambda error: bad_request(validation_message(error)),
    )


async def _answer(work: Awaitable[Response]) -> Response:
    try:
        return await work
    except Exception as error:
        return error_response(error)


def served_name(ctx: ServerContext, requested: str) -> str:
    """The model name a response reports; 404 for a model this server does not serve.

    Claude Code asks for Claude models by name (a main and a small model) unless
    told otherwise, so those names mean the served model, as Zhipu's endpoint
    maps them to GLM; the response then names the model that really answered.
    """
    if ctx.model.accepts(requested):
        return requested
    if requested.startswith(CLAUDE_PREFIX):
        return ctx.model.id
    ctx.check_model(requested)
    return requested


def output_room(prompt_tokens: int, ctx: ServerContext) -> int:
    """The tokens left for the output; a prompt that leaves none is a 400 in Anthropic's words.

    Claude Code runs its own compaction on a context overflow only when the error reads
    as Anthropic's does, `prompt is too long: N tokens > M maximum`, so that wording,
    with the real numbers: M is the longest prompt that leaves room for one token.
    """
    try:
        return output_budget(prompt_tokens, None, ctx.model)
    except APIError as error:
        if error.code != "context_length_exceeded":
            raise
        maximum = context_limit(ctx.model) - 1
        raise bad_request(
            f"prompt is too long: {prompt_tokens} tokens > {maximum} maximum"
        ) from error


async def create_message(body: MessagesRequest, ctx: ServerContext, http_request: Request):
    model = served_name(ctx, body.model)
    chat = to_chat_request(body)
    prompt = render_chat(chat, ctx.model)
    # Clients ask for a fixed, generous max_tokens (Claude Code: 32000) whatever the
    # model's context; Anthropic-style, the output gets the room left instead of a 400.
    room = output_room(len(prompt.token_ids), ctx)
    max_tokens = min(body.max_tokens, room)
    ending = partial(
        stop_reason,
        stop_sequences=body.stop_sequences,
        context_limited=max_tokens < body.max_tokens,
    )
    params = sampling_params(
        chat, max_tokens, None, skip_special_tokens=prompt.skip_special_tokens, prompt=prompt
    )
    message_id = "msg_" + uuid.uuid4().hex
    group = GenerationGroup(
        ctx.engine, [Job(prompt.token_ids, params)], message_id, ctx.cache_salt(None), ctx.metrics
    )
    await unless_disconnected(http_request, group.start())
    if body.stream:
        events = message_events(group, prompt, message_id, model, chat.parallel_tool_calls, ending)
        return anthropic_sse_response(group, events, stream_error)

    async def collect() -> dict[str, Any]:
        final = None
        async for _, output in group.outputs():
            final = output  # outputs() ends with the finished one, or raises
        parser = prompt.output_parser()
        blocks = ContentBlocks(chat.parallel_tool_calls)
        text = prompt.clean(final.outputs[0].text)
        blocks.feed(parser.feed(text) + parser.finish())
        blocks.finish()
        reason, sequence = ending(final, blocks.made_tool_calls)  # raises if the engine failed
        message = message_body(message_id, model, blocks.content(), reason, sequence)
        message["usage"] = usage(final)
        return message

    try:
        message = await unless_disconnected(http_request, collect())
    finally:
        await group.close()
    return JSONResponse(message)


async def count_tokens(body: Conversation, ctx: ServerContext) -> Response:
    """The prompt's length in tokens, as /v1/messages would render it."""
    served_name(ctx, body.model)
    prompt = render_chat(to_chat_request(body), ctx.model)
    return JSONResponse({"input_tokens": len(prompt.token_ids)})


def anthropic_router(ctx: ServerContext, max_body_bytes: int) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages")
    async def messages(request: Request) -> Response:
        async def work() -> Response:
            body = await _parse(request, MessagesRequest, max_body_bytes)
            return await create_message(body, ctx, request)

        return await _answer(work())

    @router.post("/v1/messages/count_tokens")
    async def messages_count_tokens(request: Request) -> Response:
        async def work() -> Response:
            body = await _parse(request, Conversation, max_body_bytes)
            return await count_tokens(body, ctx)

        return await _answer(work())

    return router
