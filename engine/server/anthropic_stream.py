"""A streamed Messages response: Anthropic's event sequence as server-sent events.

message_start, ping, then each content block (content_block_start, its
text_delta / thinking_delta / signature_delta / input_json_delta events,
content_block_stop), then message_delta with the stop reason and usage, and
message_stop. Every event is `event: <type>` plus `data: <json>`, as the
anthropic SDK reads them. A failure after the status line went out is sent as
an `error` event, which the SDK raises.

A tool call is held until it is complete, and a prefill can be long, so the
stream may be silent for a while; a ping every PING_SECONDS of silence keeps
proxies and idle timeouts from cutting it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from engine.requests.outputs import RequestOutput
from engine.server.anthropic_blocks import ContentBlocks
from engine.server.anthropic_translate import usage
from engine.server.chat_rendering import ChatPrompt
from engine.server.error_responses import GenerationFailed
from engine.server.generation import GenerationGroup
from engine.server.streaming import SSE_HEADERS

PING_SECONDS = 10.0
PING = {"type": "ping"}


def sse_event(payload: dict[str, Any]) -> str:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {payload['type']}\ndata: {data}\n\n"


def message_body(
    message_id: str, model: str, content: list[dict], reason: str | None, sequence: str | None
) -> dict[str, Any]:
    """A message object without usage (the caller adds it): the response, or message_start's."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
    }


async def _with_pings(events: AsyncIterator[dict], interval: float) -> AsyncIterator[dict]:
    """`events`, with a ping whenever `interval` seconds pass without one."""
    iterator = aiter(events)
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield PING
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await iterator.aclose()


def message_events(
    group: GenerationGroup,
    prompt: ChatPrompt,
    message_id: str,
    model: str,
    parallel_tool_calls: bool,
    ending: Callable[[RequestOutput, bool], tuple[str, str | None]],
) -> Callable[[], AsyncIterator[dict[str, Any]]]:
    """The events of one streamed message from a started group of one job.

    `ending(output, made_tool_calls)` gives the stop reason and stop sequence."""

    async def events() -> AsyncIterator[dict[str, Any]]:
        parser = prompt.output_parser()
        blocks = ContentBlocks(parallel_tool_calls)
        started = False
        async for _, output in group.outputs():
            completion = output.outputs[0]
            if completion.finish_reason == "error":
                raise GenerationFailed(output.error or "the engine failed this request")
            if not started:
                # The first output is there as soon as the prompt was accepted, and it
                # knows how much of the prompt the cache held.
                start = message_body(message_id, model, [], None, None)
                start["usage"] = {**usage(output), "output_tokens": 0}
                yield {"type": "message_start", "message": start}
                yield PING
                started = True
            text = prompt.clean(completion.delta_text)
            parsed = parser.feed(text) if text else []
            if output.finished:
                parsed += parser.finish()
            for event in blocks.feed(parsed):
                yield event
            if output.finished:
                for event in blocks.finish():
                    yield event
                reason, sequence = ending(output, blocks.made_tool_calls)
                yield {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage(output),
                }
                yield {"type": "message_stop"}

    return events


def anthropic_sse_response(
    group: GenerationGroup,
    events: Callable[[], AsyncIterator[dict[str, Any]]],
    error_payload: Callable[[BaseException], dict[str, Any]],
) -> StreamingResponse:
    """Stream `events()` as SSE; always close the group (a disconnect aborts the request)."""

    async def body() -> AsyncIterator[str]:
        try:
            async for payload in _with_pings(events(), PING_SECONDS):
                yield sse_event(payload)
        except Exception as error:  # the status line is sent: report in the stream
            yield sse_event(error_payload(error))
        finally:
            await group.close()

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)
