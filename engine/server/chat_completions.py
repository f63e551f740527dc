"""POST /v1/chat/completions: render, generate, parse, answer (as JSON or SSE).

The model's text is read by the output parser of chat_rendering (reasoning,
then tool calls). Streaming sends what the parser releases as it releases it:
`delta.reasoning_content`, `delta.content`, and `delta.tool_calls` (first the
call's id and name, then its arguments). The complete response runs the
same parser over the whole text, so both agree.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from engine.chat import ContentDelta, ReasoningDelta, ToolCallDelta, ToolCallEnd, ToolCallError
from engine.requests.outputs import RequestOutput
from engine.server.chat_rendering import ChatPrompt, render_chat
from engine.server.context import ServerContext, new_request_id
from engine.server.error_responses import GenerationFailed
from engine.server.generation import GenerationGroup, Job, unless_disconnected
from engine.server.logprobs import TokenText, chat_logprobs
from engine.server.protocol import ChatCompletionRequest
from engine.server.request_sampling import output_budget, sampling_params
from engine.server.streaming import sse_response

log = logging.getLogger(__name__)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def finish_reason(output: RequestOutput, made_tool_calls: bool) -> str | None:
    reason = output.outputs[0].finish_reason
    if reason == "error":
        raise GenerationFailed(output.error or "the engine failed this request")
    return "tool_calls" if made_tool_calls and reason == "stop" else reason


def usage_of(finals: dict[int, RequestOutput]) -> dict:
    """Usage over all choices: the shared prompt counted once, every choice's output counted."""
    first = finals[min(finals)]
    completion = sum(len(output.outputs[0].token_ids) for output in finals.values())
    return usage(len(first.prompt_token_ids), completion, first.num_cached_tokens)


class ChoiceStream:
    """One choice of a streamed response: model text in, chunk `choices` entries out."""

    def __init__(self, index: int, prompt: ChatPrompt, request: ChatCompletionRequest, text):
        self.index = index
        self.prompt = prompt
        self.parser = prompt.output_parser()
        self.parallel_tool_calls = request.parallel_tool_calls
        self.logprobs_top = (request.top_logprobs or 0) if request.logprobs else None
        self.token_text = text
        self.logprobs_sent = 0
        self.made_tool_calls = False

    def _logprobs(self, output: RequestOutput, pending: bool) -> dict | None:
        entries = output.outputs[0].logprobs
        if self.logprobs_top is None or not entries or not pending:
            return None
        new = entries[self.logprobs_sent :]
        self.logprobs_sent = len(entries)
        return chat_logprobs(new, self.logprobs_top, self.token_text) if new else None

    def advance(self, output: RequestOutput) -> list[dict]:
        completion = output.outputs[0]
        if completion.finish_reason == "error":
            raise GenerationFailed(output.error or "the engine failed this request")
        text = self.prompt.clean(completion.delta_text)
        events = self.parser.feed(text) if text else []
        if output.finished:
            events += self.parser.finish()
        choices = []
        for event in events:
            delta = self._delta(event)
            if delta is not None:
                logprobs = self._logprobs(output, "content" in delta)
                choices.append(self._choice(delta, logprobs, None))
        if output.finished:
            reason = finish_reason(output, self.made_tool_calls)
            choices.append(self._choice({}, self._logprobs(output, True), reason))
        return choices

    def _delta(self, event) -> dict | None:
        if isinstance(event, ContentDelta):
            return {"content": event.text}
        if isinstance(event, ReasoningDelta):
            return {"reasoning_content": event.text}
        if isinstance(event, ToolCallDelta):
            if event.index > 0 and not self.parallel_tool_calls:
                return None
            return {"tool_calls": [event.to_openai()]}
        if isinstance(event, ToolCallEnd):
            # Counted when complete: a call voided after its first delta is no call.
            if event.index == 0 or self.parallel_tool_calls:
                self.made_tool_calls = True
            return None
        if isinstance(event, ToolCallError):
            log.info("malformed tool call passed on as text: %s", event.message)
        return None

    def _choice(self, delta: dict, logprobs: dict | None, reason: str | None) -> dict:
        return {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}


def _message(
    prompt: ChatPrompt, request: ChatCompletionRequest, output: RequestOutput
) -> tuple[dict, bool]:
    text = prompt.clean(output.outputs[0].text)
    parsed = prompt.output_parser().parse_complete(text)
    for error in parsed.errors:
        log.info("malformed tool call passed on as text: %s", error)
    calls = parsed.tool_calls if request.parallel_tool_calls else parsed.tool_calls[:1]
    message: dict = {"role": "assistant", "content": parsed.content or (None if calls else "")}
    if parsed.reasoning_content is not None:
        message["reasoning_content"] = parsed.reasoning_content
    if calls:
        message["tool_calls"] = [call.to_openai() for call in calls]
    return message, bool(calls)


async def create_chat_completion(
    request: ChatCompletionRequest, ctx: ServerContext, http_request: Request
) -> Response:
    ctx.check_model(request.model)
    prompt = render_chat(request, ctx.model)
    max_tokens = output_budget(len(prompt.token_ids), request.output_budget, ctx.model)
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    jobs = [
        Job(
            prompt.token_ids,
            sampling_params(
                request,
                max_tokens,
                logprobs,
                skip_special_tokens=prompt.skip_special_tokens,
                choice_index=index,
                prompt=prompt,
            ),
        )
        for index in range(request.n)
    ]
    request_id = new_request_id("chatcmpl")
    model_id = request.model or ctx.model.id
    group = GenerationGroup(
        ctx.engine, jobs, request_id, ctx.cache_salt(request.cache_salt), ctx.metrics
    )
    await unless_disconnected(http_request, group.start())
    token_text = TokenText(ctx.model.tokenizer)
    created = int(time.time())
    include_usage = bool(
        request.stream and request.stream_options and request.stream_options.include_usage
    )

    def chunk(choices: list[dict], usage_value: dict | None = None) -> dict:
        body = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model_id,
            "choices": choices,
        }
        if include_usage:  # OpenAI sends "usage": null on every chunk but the last
            body["usage"] = usage_value
        return body

    async def stream() -> AsyncIterator[dict]:
        choices = [ChoiceStream(i, prompt, request, token_text) for i in range(request.n)]
        for i in range(request.n):
            role = {"role": "assistant", "content": ""}
            yield chunk([{"index": i, "delta": role, "logprobs": None, "finish_reason": None}])
        finals: dict[int, RequestOutput] = {}
        async for index, output in group.outputs():
            for choice in choices[index].advance(output):
                yield chunk([choice])
            if output.finished:
                finals[index] = output
        if include_usage:
            yield chunk([], usage_of(finals))

    if request.stream:
        return sse_response(group, stream)

    async def collect() -> dict:
        finals: dict[int, RequestOutput] = {}
        async for index, output in group.outputs():
            if output.finished:
                finals[index] = output
        choices = []
        for index in range(request.n):
            output = finals[index]
            message, made_calls = _message(prompt, request, output)
            entries = output.outputs[0].logprobs
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": chat_logprobs(entries or [], logprobs, token_text)
                    if logprobs is not None
                    else None,
                    "finish_reason": finish_reason(output, made_calls),
                }
            )
        return {
            "id": request_id,
            "object": "chat.completion",
            "created": created,
            "model": model_id,
            "choices": choices,
            "usage": usage_of(finals),
        }

    try:
        body = await unless_disconnected(http_request, collect())
    finally:
        await group.close()
    return JSONResponse(body)
