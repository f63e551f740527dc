"""The FastAPI app: routes, middleware and error handling over one served model.

`create_app(engine, model)` takes any engine with AsyncEngine's `generate` and
`stats` (engine/server/serving_engine.py; tests pass a scripted fake), so the HTTP behaviour can
be tested without a model. The app does not own the engine: whoever built it
shuts it down (see launch.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from engine.server.anthropic_messages import anthropic_router
from engine.server.auth import ApiKeyMiddleware
from engine.server.chat_completions import create_chat_completion
from engine.server.completions import create_completion
from engine.server.context import ServerContext
from engine.server.error_responses import (
    APIError,
    from_exception,
    install_error_handlers,
)
from engine.server.metrics import CONTENT_TYPE, HttpMetricsMiddleware, ServerMetrics
from engine.server.protocol import ChatCompletionRequest, CompletionRequest
from engine.server.request_body import MAX_BODY_BYTES, parse_body
from engine.server.responses import responses_router
from engine.server.served_model import ServedModel
from engine.server.serving_engine import ServingEngine
from engine.server.tokenize_routes import tokenize_router
from engine.server.worker_routes import worker_router

log = logging.getLogger(__name__)

# Seconds an idle keep-alive connection stays open. Longer than clients' own
# idle expiry (httpx, and so the openai client: 5 s), so that the client, not
# the server, closes it: otherwise a request sent just as the server closes
# the connection is lost.
KEEP_ALIVE_SECONDS = 30


async def _answer(work: Awaitable[Response]) -> Response:
    """Await a handler; any failure becomes the OpenAI-style error the client should see.

    Converting here (not in a catch-all exception handler) keeps expected
    errors such as a refused prompt out of the server log's tracebacks.
    """
    try:
        return await work
    except APIError:
        raise
    except Exception as error:
        raise from_exception(error) from error


def _engine_alive(engine: ServingEngine) -> bool:
    alive = getattr(engine, "is_alive", None)
    # Test doubles without a thread count as alive.
    return bool(alive()) if callable(alive) else True


def _engine_failure(engine: ServingEngine) -> str | None:
    """Why the engine cannot serve (e.g. a tensor-parallel rank died), when it says."""
    failure = getattr(engine, "failure", None)
    return failure() if callable(failure) else None


def create_app(engine: ServingEngine, model: ServedModel, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="Resident engine", docs_url=None, redoc_url=None, openapi_url=None)
    ctx = ServerContext(
        engine=engine, model=model, metrics=ServerMetrics(model.id), api_key=api_key
    )
    app.state.ctx = ctx
    install_error_handlers(app)
    app.include_router(anthropic_router(ctx, MAX_BODY_BYTES))
    app.include_router(responses_router(ctx, parse_body, _answer))
    app.include_router(worker_router(ctx))  # what routers call: model, server, load, flush
    app.include_router(tokenize_router(ctx))  # token ids without generating (kv_aware routing)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest)
        return await _answer(create_chat_completion(body, ctx, request))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await parse_body(request, CompletionRequest)
        return await _answer(create_completion(body, ctx, request))

    @app.get("/v1/models")
    async def models() -> dict:
        card = {
            "id": model.id,
            "object": "model",
            "created": model.created,
            "owned_by": "resident",
            "max_model_len": model.max_context_tokens,
        }
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{name:path}")
    async def model_card(name: str) -> dict:
        ctx.check_model(name)
        return {"id": model.id, "object": "model", "created": model.created, "owned_by": "resident"}

    @app.get("/v1/engine/stats")
    async def engine_stats() -> dict:
        return {"model": model.id, **(await engine.stats()), "settings": model.settings}

    @app.get("/metrics")
    async def metrics() -> Response:
        stats = await engine.stats()
        return Response(ctx.metrics.render(stats), media_type=CONTENT_TYPE)

    @app.get("/health")
    async def health() -> Response:
        failure = _engine_failure(engine)
        if failure is None and _engine_alive(engine):
            return JSONResponse({"status": "ok"})
        message = f"the engine has failed: {failure}" if failure else "the engine has stopped"
        return APIError(503, message, type="server_error", code="engine_failed").response()

    # Outermost last: metrics see every response, the 401s included.
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(HttpMetricsMiddleware, metrics=ctx.metrics)
    return app
