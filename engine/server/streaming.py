"""Server-sent events exactly as OpenAI's clients read them.

Each event is `data: <json>\\n\\n`; the stream ends with `data: [DONE]\\n\\n`.
An error after the response has started cannot change the status code, so
it is sent as `data: {"error": {...}}` (the openai client raises it as an
APIError) followed by [DONE].
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from engine.server.error_responses import from_exception
from engine.server.generation import GenerationGroup

log = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def sse_response(
    group: GenerationGroup, events: Callable[[], AsyncIterator[dict]]
) -> StreamingResponse:
    """Stream the chunks `events()` makes from a started group; always close the group.

    When the client disconnects, Starlette cancels this generator; the
    `finally` then closes the group, which aborts the engine requests.
    """

    async def body() -> AsyncIterator[str]:
        try:
            async for payload in events():
                yield sse(payload)
        except Exception as error:  # the status line is sent: report in the stream
            yield sse(from_exception(error).body())
        finally:
            await group.close()
        yield DONE

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)
