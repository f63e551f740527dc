"""The endpoints routers call on their workers, so a `resident serve` replica is a
first-class worker behind sglang-router and vllm-router (and any router that speaks
SGLang's worker API). Shapes: engine/server/worker_facts.py.

What each router calls (read from sglang-router 0.3.2's and vllm-router 0.1.17's
sources and checked against their logs):

- sglang-router registers a worker with `GET /server_info` and `GET /model_info`
  (each falling back to `/get_server_info`, `/get_model_info` on a 404, with a
  warning), polls `GET /get_load` for `/get_loads` and its power-of-two policy,
  and fans `POST /flush_cache` out to every worker. It sends its `--api-key` as a
  bearer token on all of these; `GET /health` goes without one.
- vllm-router passes `GET /get_model_info`, `/model_info`, `/get_server_info`,
  `/server_info` and `/health_generate` through to one worker, with the client's
  `Authorization` header; `/get_loads` polls `GET /get_load` and `/flush_cache` fans
  `POST /flush_cache` out, both with no key at all. Its `/get_load` reader wants an
  object `{"load": N}` where sglang-router's wants SGLang's list: one path cannot
  answer both, and SGLang's shape is served (vllm-router's `/get_loads` shows -1).

The API-key rule holds here as everywhere (engine/server/auth.py): with a key,
every route but `/health` needs it. So a replica with a key serves sglang-router
fully, and vllm-router's load poll and flush only without one (on loopback).

`POST /flush_cache` forgets every cached prefix: the radix tree's pages that no
request holds, pinned ones included (their pins stay, so the session's next
prefill caches and protects them again), the host tier and this engine's page
files on disk; the answer says what was dropped and what running requests kept.
`GET /health_generate` generates one token (as SGLang's does), 503 when the engine
cannot within HEALTH_GENERATE_TIMEOUT_S.

`GET /kv_event_sources` is how vllm-router's `kv_aware` policy finds a worker's KV-event
stream when it is not given `--kv-event-source` (src/kv_index/discovery.rs): the
publisher per data-parallel rank, and `kv_block_size` from `/get_server_info`. With a key
it sends its own `--api-key`. Events off, the answer is `{}`: no stream to subscribe to.
The tokenizing endpoints its policy calls are engine/server/tokenize_routes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from engine.requests.params import SamplingParams
from engine.server.context import ServerContext, new_request_id
from engine.server.error_responses import APIError, GenerationFailed, from_exception
from engine.server.serving_engine import ServingEngine
from engine.server.worker_facts import load_entries, model_info, server_info

log = logging.getLogger(__name__)

HEALTH_GENERATE_PROMPT = "Hello"
HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's own health_generate timeout


async def generate_one_token(engine: ServingEngine, timeout_s: float) -> int:
    """Generate one token of a fixed prompt; returns the tokens generated. Raises what
    the engine raises (a full queue, a failed engine), TimeoutError past `timeout_s`."""
    params = SamplingParams(max_tokens=1, temperature=0.0)

    async def run() -> int:
        generated = 0
        stream = engine.generate(HEALTH_GENERATE_PROMPT, params, new_request_id("health"))
        async with contextlib.aclosing(stream):  # closed early (a timeout): aborted
            async for output in stream:
                generated = len(output.outputs[0].token_ids) if output.outputs else 0
                if output.error:
                    raise GenerationFailed(output.error)
        return generated

    return await asyncio.wait_for(run(), timeout_s)


def worker_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()

    async def model_facts() -> dict:
        return model_info(ctx.model)

    async def server_facts() -> dict:
        return server_info(ctx.model, await ctx.engine.stats())

    for path in ("/model_info", "/get_model_info"):
        router.add_api_route(path, model_facts, methods=["GET"])
    for path in ("/server_info", "/get_server_info"):
        router.add_api_route(path, server_facts, methods=["GET"])

    @router.get("/get_load")
    async def get_load() -> list[dict]:
        return load_entries(await ctx.engine.load())

    @router.post("/flush_cache")
    async def flush_cache() -> dict:
        try:
            report = await ctx.engine.flush_cache()
        except Exception as error:
            raise from_exception(error) from error
        log.info("prefix cache flushed: %s", report)
        kept = report.get("in_use_tokens", 0)
        dropped = {key: value for key, value in report.items() if key != "in_use_tokens"}
        message = "Cache flushed." + (
            f" {kept} tokens held by running requests stay until they finish." if kept else ""
        )
        return {
            "success": True,
            "message": message,
            "dropped": dropped,
            "kept": {"in_use_tokens": kept},
        }

    @router.get("/kv_event_sources")
    async def kv_event_sources() -> dict:
        return await ctx.engine.kv_event_sources()

    @router.get("/health_generate")
    async def health_generate() -> JSONResponse:
        try:
            tokens = await generate_one_token(ctx.engine, HEALTH_GENERATE_TIMEOUT_S)
        except TimeoutError:
            message = f"the engine generated no token in {HEALTH_GENERATE_TIMEOUT_S:g} s"
            error = APIError(503, message, type="server_error", code="engine_unresponsive")
            return error.response()
        except Exception as error:  # whatever the cause, the worker cannot serve: 503
            failed = from_exception(error)
            code = failed.code if failed.status == 503 else "engine_failed"
            return APIError(503, failed.message, type="server_error", code=code).response()
        if tokens < 1:
            message = "the engine finished the health check without a token"
            return APIError(503, message, type="server_error", code="engine_failed").response()
        return JSONResponse({"status": "ok", "generated_tokens": tokens})

    return router
