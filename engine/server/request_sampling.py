"""From an API request to the engine's SamplingParams, with the context checked first.

The length check happens here, before anything is submitted, so that a
prompt that cannot fit is a 400 naming both numbers rather than an error
from deep inside the engine.
"""

from __future__ import annotations

import logging
from typing import Any

from engine.errors import EngineError
from engine.grammar import GrammarError, StructuredOutput, ToolCallConstraint
from engine.grammar.spec import reasoning_mode, tool_schemas
from engine.requests.params import SamplingParams
from engine.server.error_responses import bad_request
from engine.server.protocol import ChatCompletionRequest, NamedToolChoice, SamplingFields
from engine.server.served_model import ServedModel

log = logging.getLogger(__name__)


def _limit(model: ServedModel) -> tuple[int, str]:
    if model.capacity_tokens < model.max_context_tokens:
        return model.capacity_tokens, "the KV cache's capacity (capacity_tokens)"
    return model.max_context_tokens, "the model's context (max_context_tokens)"


def context_limit(model: ServedModel) -> int:
    """The most tokens one request, prompt and output together, may have."""
    return _limit(model)[0]


def output_budget(prompt_tokens: int, requested: int | None, model: ServedModel) -> int:
    """max_tokens for one prompt: as requested, or all the room left; 400 when it cannot fit."""
    limit, what = _limit(model)
    if requested is None:
        if prompt_tokens >= limit:
            raise bad_request(
                f"the prompt has {prompt_tokens} tokens but {what} is {limit} tokens, "
                "with room needed for at least one generated token; shorten the prompt",
                param="messages",
                code="context_length_exceeded",
            )
        return limit - prompt_tokens
    if prompt_tokens + requested > limit:
        raise bad_request(
            f"the prompt has {prompt_tokens} tokens and max_tokens is {requested}: "
            f"{prompt_tokens + requested} tokens in all, more than {what} of {limit} tokens; "
            "shorten the prompt or lower max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested


def structured_output(request: SamplingFields, prompt: Any) -> StructuredOutput | None:
    """The constraint a chat request asks for, in the tool-call format `prompt` is read with.

    - `tool_choice` "required": one or more calls to the offered tools (one when
      `parallel_tool_calls` is false); a named function: exactly one call to it.
    - `response_format` json_object / json_schema: that JSON answer; when tools
      are offered (`tool_choice` auto), the model may call them instead.
    - Otherwise nothing: `auto` stays free text (the parser reads what comes).

    `prompt` is the rendered chat (engine.rendering.RenderedChat): its parser
    names the format, its reasoning flags what may come before the answer.
    """
    if not isinstance(request, ChatCompletionRequest) or prompt is None:
        return None
    choice = request.tool_choice
    named = isinstance(choice, NamedToolChoice)
    parser, tools = prompt.tool_parser, list(prompt.tools or [])
    if (named or choice == "required") and not parser:
        log.warning("tool_choice %r left unconstrained: no tool-call format for this model", choice)
    calls = None
    if parser and tools:
        calls = ToolCallConstraint(
            parser,
            tool_schemas(tools),
            required=True,
            parallel=request.parallel_tool_calls and not named,
        )
    reasoning = reasoning_mode(prompt.reasoning, prompt.starts_in_reasoning)
    if calls is not None and (named or choice == "required"):
        return StructuredOutput(tool_calls=calls, reasoning=reasoning, source="tools")
    answer = request.response_format
    if answer is None or answer.type == "text":
        return None
    if answer.type == "json_object":
        body: dict[str, Any] = {"json_object": True}
    else:
        body = {"json_schema": answer.json_schema.schema_}
    return StructuredOutput(
        **body,
        tool_calls=calls,
        reasoning=reasoning,
        source="response_format.json_schema.schema" if "json_schema" in body else "response_format",
    )


def checked_structured_output(request: SamplingFields, prompt: Any) -> StructuredOutput | None:
    """structured_output, with a schema that cannot be enforced a 400 naming where it is."""
    try:
        spec = structured_output(request, prompt)
        if spec is not None:
            from engine.grammar.builder import validate  # xgrammar only when used

            validate(spec)
        return spec
    except GrammarError as error:
        raise bad_request(str(error), param=error.param) from error


def sampling_params(
    request: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    skip_special_tokens: bool = True,
    choice_index: int = 0,
    prompt: Any = None,
) -> SamplingParams:
    """SamplingParams for one choice; choice i of n samples with seed + i, so choices differ.

    `prompt` (a chat's rendered prompt) lets `tool_choice` and `response_format`
    constrain the output (structured_output).
    """
    seed = None if request.seed is None else request.seed + choice_index
    structured = checked_structured_output(request, prompt)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            min_p=request.min_p,
            seed=seed,
            stop=request.stop,
            stop_token_ids=list(request.stop_token_ids or []),
            ignore_eos=request.ignore_eos,
            speculative=request.speculative,
            include_stop_str_in_output=request.include_stop_str_in_output,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            repetition_penalty=request.repetition_penalty,
            skip_special_tokens=skip_special_tokens,
            structured=structured,
        )
    except EngineError as error:
        raise bad_request(str(error)) from error
