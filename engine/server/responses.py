"""POST /v1/responses (and GET/DELETE of stored ones): OpenAI's Responses API over the chat pipeline.

A request is translated into the server's chat request (responses_input),
rendered, budgeted and sampled exactly as /v1/chat/completions does, and
its output assembled into Responses items (responses_stream), as one JSON
object or as the semantic event stream. Responses are kept in a small
in-memory store (responses_store) unless `store: false`, so
`previous_response_id` chains within one server process and
`GET /v1/responses/{id}` finds recent ones.

Errors before the first byte are HTTP errors in OpenAI's error shape (the
SDK raises its typed exceptions); a failure after the stream started ends it
with `response.failed`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from engine.server.chat_rendering import render_chat
from engine.server.context import ServerContext
from engine.server.generation import GenerationGroup, Job, unless_disconnected
from engine.server.request_sampling import output_budget, sampling_params
from engine.server.responses_input import chat_request, input_items, text_format
from engine.server.responses_protocol import ResponsesRequest, new_id, response_shell
from engine.server.responses_store import ResponseStore
from engine.server.responses_stream import ResponseAssembler, stream_response
from engine.server.responses_tools import response_tools

ParseBody = Callable[[Request, type], Awaitable[Any]]
Answer = Callable[[Awaitable[Response]], Awaitable[Response]]


async def create_response(
    request: ResponsesRequest, ctx: ServerContext, store: ResponseStore, http_request: Request
) -> Response:
    ctx.check_model(request.model)
    tools = response_tools(request.tools)
    fmt = text_format(request.text)
    new_items = input_items(request)
    history = store.history(request.previous_response_id) if request.previous_response_id else []
    chat = chat_request(request, history + new_items, tools.functions, fmt)
    prompt = render_chat(chat, ctx.model)
    max_tokens = output_budget(len(prompt.token_ids), chat.output_budget, ctx.model)
    params = sampling_params(
        chat, max_tokens, None, skip_special_tokens=prompt.skip_special_tokens, prompt=prompt
    )
    response_id = new_id("resp")
    group = GenerationGroup(
        ctx.engine,
        [Job(prompt.token_ids, params)],
        response_id,
        ctx.cache_salt(chat.cache_salt),
        ctx.metrics,
    )
    await unless_disconnected(http_request, group.start())
    shell = response_shell(request, response_id, request.model or ctx.model.id, tools.echo, fmt)
    assembler = ResponseAssembler(
        shell, prompt, chat.parallel_tool_calls, request.wants_reasoning_token, tools.split
    )

    def keep(response: dict[str, Any]) -> None:
        if request.stores:
            store.put(response, new_items, request.previous_response_id)

    if request.stream:
        return stream_response(group, assembler, keep)

    async def collect() -> dict[str, Any]:
        assembler.start()
        async for _, output in group.outputs():
            assembler.advance(output)
        return assembler.response

    try:
        body = await unless_disconnected(http_request, collect())
    finally:
        await group.close()
    keep(body)
    return JSONResponse(body)


def responses_router(ctx: ServerContext, parse_body: ParseBody, answer: Answer) -> APIRouter:
    """The routes, over app.py's body parsing and error mapping (passed in: app.py imports us)."""
    router = APIRouter()
    store = ResponseStore()

    @router.post("/v1/responses")
    async def create(request: Request) -> Response:
        body = await parse_body(request, ResponsesRequest)
        return await answer(create_response(body, ctx, store, request))

    @router.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str) -> dict[str, Any]:
        return store.get(response_id)

    @router.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> dict[str, Any]:
        store.get(response_id)  # 404 when unknown
        store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    return router
