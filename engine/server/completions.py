"""POST /v1/completions: raw prompts (text or token ids, one or a list) continued.

`echo` puts the prompt in front of the text; with `logprobs` it also gives
the prompt tokens' logprobs (the engine computes them for the whole prompt
when `SamplingParams.prompt_logprobs` is set), in OpenAI's completions shape.
Choice `p * n + i` is choice i of prompt p.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from engine.requests.outputs import RequestOutput
from engine.requests.params import SamplingParams
from engine.server.context import ServerContext, new_request_id
from engine.server.error_responses import GenerationFailed, bad_request
from engine.server.generation import GenerationGroup, Job, unless_disconnected
from engine.server.logprobs import CompletionLogprobs, TokenText
from engine.server.protocol import CompletionRequest
from engine.server.request_sampling import output_budget, sampling_params
from engine.server.streaming import sse_response


@dataclass
class _Choice:
    prompt_index: int
    prompt_ids: list[int]
    prompt_text: str
    logprobs: CompletionLogprobs | None
    started: bool = False
    logprobs_sent: int = 0


def _check(output: RequestOutput) -> None:
    if output.outputs[0].finish_reason == "error":
        raise GenerationFailed(output.error or "the engine failed this request")


def _usage(choices: list[_Choice], finals: dict[int, RequestOutput], n: int) -> dict:
    # Each prompt counts once however many choices it had.
    firsts = [finals[index] for index in range(0, len(choices), n)]
    prompt = sum(len(output.prompt_token_ids) for output in firsts)
    cached = sum(output.num_cached_tokens for output in firsts)
    completion = sum(len(output.outputs[0].token_ids) for output in finals.values())
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


class _Pieces:
    """Text and logprobs of a choice as outputs arrive (the first output carries the echo)."""

    def __init__(self, echo: bool) -> None:
        self.echo = echo

    def take(self, choice: _Choice, output: RequestOutput, whole: bool) -> tuple[str, dict | None]:
        completion = output.outputs[0]
        text = completion.text if whole else completion.delta_text
        first = not choice.started
        choice.started = True
        if self.echo and first:
            text = choice.prompt_text + text
        if choice.logprobs is None:
            return text, None
        entries: list = []
        token_ids: list[int] = []
        if self.echo and first and output.prompt_logprobs is not None:
            entries += output.prompt_logprobs
            token_ids += output.prompt_token_ids
        generated = completion.logprobs or []
        new = generated[choice.logprobs_sent :]
        choice.logprobs_sent = len(generated)
        entries += new
        token_ids += [entry.token_id for entry in new]
        return text, choice.logprobs.build(entries, token_ids)


def prompt_ids(prompt: str | list[int], index: int, tokenizer) -> list[int]:
    """The token ids one prompt of a completions request prefills (also what
    /v1/completions/render reports: engine/server/tokenize_routes.py)."""
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise bad_request(f"prompt {index} is empty", param="prompt")
    return ids


def completion_params(
    request: CompletionRequest, ids: list[int], ctx: ServerContext, choice_index: int = 0
) -> SamplingParams:
    """One choice's sampling for a prompt of `ids` tokens: its output budget, logprobs,
    prompt logprobs when `echo` asks for them (also what /v1/completions/render sends)."""
    wants_prompt_logprobs = request.echo and request.logprobs is not None
    skip = True if request.skip_special_tokens is None else request.skip_special_tokens
    return sampling_params(
        request,
        output_budget(len(ids), request.max_tokens, ctx.model),
        request.logprobs,
        prompt_logprobs=request.logprobs if wants_prompt_logprobs else None,
        skip_special_tokens=skip,
        choice_index=choice_index,
    )


async def create_completion(
    request: CompletionRequest, ctx: ServerContext, http_request: Request
) -> Response:
    ctx.check_model(request.model)
    tokenizer = ctx.model.tokenizer
    token_text = TokenText(tokenizer)
    n = request.n
    jobs: list[Job] = []
    choices: list[_Choice] = []
    for prompt_index, prompt in enumerate(request.prompts()):
        ids = prompt_ids(prompt, prompt_index, tokenizer)
        if isinstance(prompt, str):
            text = prompt
        elif request.echo:
            text = tokenizer.decode(ids, skip_special_tokens=False)
        else:
            text = ""
        for i in range(n):
            params = completion_params(request, ids, ctx, choice_index=i)
            jobs.append(Job(ids, params))
            logprobs = None
            if request.logprobs is not None:
                logprobs = CompletionLogprobs(token_text, request.logprobs)
            choices.append(_Choice(prompt_index, ids, text, logprobs))

    request_id = new_request_id("cmpl")
    model_id = request.model or ctx.model.id
    group = GenerationGroup(
        ctx.engine, jobs, request_id, ctx.cache_salt(request.cache_salt), ctx.metrics
    )
    await unless_disconnected(http_request, group.start())
    created = int(time.time())
    pieces = _Pieces(request.echo)
    include_usage = bool(
        request.stream and request.stream_options and request.stream_options.include_usage
    )

    def body(choice_list: list[dict], usage: dict | None = None) -> dict:
        result = {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": model_id,
            "choices": choice_list,
        }
        if usage is not None or include_usage:  # streams: "usage": null until the last
            result["usage"] = usage
        return result

    def choice_entry(index: int, text: str, logprobs: dict | None, reason: str | None) -> dict:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    async def stream() -> AsyncIterator[dict]:
        finals: dict[int, RequestOutput] = {}
        async for index, output in group.outputs():
            _check(output)
            text, logprobs = pieces.take(choices[index], output, whole=False)
            reason = output.outputs[0].finish_reason if output.finished else None
            if text or logprobs or reason:
                yield body([choice_entry(index, text, logprobs, reason)])
            if output.finished:
                finals[index] = output
        if include_usage:
            yield body([], _usage(choices, finals, n))

    if request.stream:
        return sse_response(group, stream)

    async def collect() -> dict:
        finals: dict[int, RequestOutput] = {}
        async for index, output in group.outputs():
            _check(output)
            if output.finished:
                finals[index] = output
        entries = []
        for index, choice in enumerate(choices):
            output = finals[index]
            text, logprobs = pieces.take(choice, output, whole=True)
            entries.append(choice_entry(index, text, logprobs, output.outputs[0].finish_reason))
        return body(entries, _usage(choices, finals, n))

    try:
        result = await unless_disconnected(http_request, collect())
    finally:
        await group.close()
    return JSONResponse(result)
