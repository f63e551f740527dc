"""From an API request to the engine's SamplingParams, with the context checked first.

The length check happens here, before anything is submitted, so that a
prompt that cannot fit is a 400 naming both numbers rather than an error
from deep inside the engine.
"""

from __future__ import annotations

from engine.errors import EngineError
from engine.sampling_params import SamplingParams
from engine.server.errors import bad_request
from engine.server.protocol import SamplingFields
from engine.server.served_model import ServedModel


def _limit(model: ServedModel) -> tuple[int, str]:
    if model.capacity_tokens < model.max_context_tokens:
        return model.capacity_tokens, "the KV cache's capacity (capacity_tokens)"
    return model.max_context_tokens, "the model's context (max_context_tokens)"


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


def sampling_params(
    request: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    skip_special_tokens: bool = True,
    choice_index: int = 0,
) -> SamplingParams:
    """SamplingParams for one choice; choice i of n samples with seed + i, so choices differ."""
    seed = None if request.seed is None else request.seed + choice_index
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
            include_stop_str_in_output=request.include_stop_str_in_output,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            repetition_penalty=request.repetition_penalty,
            skip_special_tokens=skip_special_tokens,
        )
    except EngineError as error:
        raise bad_request(str(error)) from error
