"""Token ids for a prompt without generating: /tokenize, /detokenize and the render endpoints.

vllm-router's `kv_aware` policy (0.1.17, src/backend/preprocess.rs) scores a
worker by the cached blocks of the prompt's token ids. A completion's token-id
prompt it takes as given; for anything else it asks each worker, within one
second for all of them:

- `POST /v1/chat/completions/render` (or `/v1/completions/render`) with the
  request body as it will forward it; it reads `token_ids` from the answer, an
  object or a list of them (one per prompt), and refuses one whose `features`
  is set (multimodal). A 404, 405 or 501 sends it on to
- `POST /tokenize` with `prompt` (one request per completions prompt) or
  `messages`, plus `model`, `add_special_tokens`, `chat_template`,
  `chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`
  when the request had them (never for chats with tools: the fallback is
  skipped); it reads `tokens`, checks `count` equals their number and that
  `max_model_len`, when given, is not below it.

Without an answer the request earns no prefix credit. So both are served, in
vLLM's shapes (vllm/entrypoints/serve/tokenize/protocol.py,
vllm/entrypoints/serve/render/serving.py, disagg/protocol.py GenerateRequest):

- `/tokenize`: `{"prompt": str}` (add_special_tokens default true) or
  `{"messages": [...]}` (tools, add_generation_prompt default true,
  continue_final_message, chat_template_kwargs, add_special_tokens default
  false); `return_token_strs` asks for the tokens' strings too. Answer:
  `{"count", "max_model_len", "tokens", "token_strs"}`.
- `/detokenize`: `{"tokens": [...]}` -> `{"prompt": text}` (special tokens kept).
- `/v1/chat/completions/render`: a chat completions body -> one GenerateRequest:
  `{"request_id", "token_ids", "features": null, "sampling_params", "model",
  "stream", "stream_options", "cache_salt", "priority", "kv_transfer_params"}`.
- `/v1/completions/render`: a completions body -> a list of them, one per prompt.

The ids are the prompt the engine prefills for the same request: chats through
the server's one renderer (chat_rendering.render_chat) and completions through
completions.prompt_ids, so a router's block hashes match the engine's KV events.
A render checks what the generating route checks (the model, the context, tool
schemas, response_format) and answers the same 400s. A request's own Jinja
`chat_template` is refused, as vLLM refuses it unless told to trust requests.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine.requests.params import SamplingParams
from engine.server.chat_rendering import render_chat
from engine.server.completions import completion_params, prompt_ids
from engine.server.context import ServerContext
from engine.server.error_responses import (
    APIError,
    bad_request,
    from_exception,
    from_validation_error,
)
from engine.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
    TokenId,
    ToolDefinition,
)
from engine.server.request_body import parse_body
from engine.server.request_sampling import output_budget, sampling_params


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")  # as everywhere: unknown fields are ignored


class TokenizeCompletionRequest(_Lenient):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Lenient):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDefinition] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # the chat template adds what the model needs
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False

    @model_validator(mode="before")
    @classmethod
    def _one_ending(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("continue_final_message"):
            if data.get("add_generation_prompt"):
                raise ValueError(
                    "continue_final_message and add_generation_prompt cannot both be true"
                )
        return data

    def as_chat(self) -> ChatCompletionRequest:
        """The chat completions request whose prompt this is."""
        fields = self.model_dump(
            include={"messages", "tools", "chat_template_kwargs", "continue_final_message"},
            exclude_none=True,
        )
        try:
            return ChatCompletionRequest.model_validate(fields)
        except ValidationError as error:  # e.g. continue_final_message after a user message
            raise from_validation_error(error) from error


class DetokenizeRequest(_Lenient):
    model: str | None = None
    tokens: list[TokenId]


class _TokenizeKind(_Lenient):
    prompt: Any = None
    messages: Any = None


def _vocab_size(tokenizer: Any) -> int | None:
    try:
        return len(tokenizer)
    except TypeError:  # a tokenizer that does not say
        return None


def _check_vocab(ids: list[int], tokenizer: Any, param: str) -> None:
    vocab = _vocab_size(tokenizer)
    if vocab is None:
        return
    bad = [i for i in ids if i >= vocab]
    if bad:
        raise bad_request(
            f"token ids {bad[:5]} are outside the tokenizer's vocabulary (0..{vocab - 1})",
            param=param,
        )


def _sampling_dict(params: SamplingParams, request: SamplingFields) -> dict[str, Any]:
    """vLLM's SamplingParams fields that this request sets, as the engine will use them."""
    return {
        "n": request.n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "min_p": params.min_p,
        "seed": params.seed,
        "stop": list(params.stop or []),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "include_stop_str_in_output": params.include_stop_str_in_output,
        "logprobs": params.logprobs,
        "prompt_logprobs": params.prompt_logprobs,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty,
        "skip_special_tokens": params.skip_special_tokens,
    }


def _generate_request(
    prefix: str, token_ids: list[int], params: SamplingParams, request: SamplingFields
) -> dict[str, Any]:
    """vLLM's GenerateRequest (what its render endpoints answer) for one prompt."""
    return {
        "request_id": f"{prefix}-{uuid.uuid4().hex}",
        "token_ids": token_ids,
        "features": None,  # text only: no multimodal placeholders
        "sampling_params": _sampling_dict(params, request),
        "model": request.model,
        "stream": request.stream,
        "stream_options": request.stream_options.model_dump()
        if request.stream and request.stream_options
        else None,
        "cache_salt": request.cache_salt,
        "priority": 0,
        "kv_transfer_params": None,
    }


def _converted(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Any failure becomes the OpenAI-style error the client should see (as app._answer)."""

    @functools.wraps(handler)
    async def run(request: Request) -> Any:
        try:
            return await handler(request)
        except APIError:
            raise
        except Exception as error:
            raise from_exception(error) from error

    return run


def tokenize_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()
    tokenizer = ctx.model.tokenizer

    def chat_tokens(body: TokenizeChatRequest) -> list[int]:
        if body.chat_template is not None:
            raise bad_request(
                "this server renders chats with the model's own template only; "
                "a request's chat_template is not accepted",
                param="chat_template",
            )
        prompt = render_chat(body.as_chat(), ctx.model, body.add_generation_prompt)
        if body.add_special_tokens:  # on top of what the template wrote, as vLLM does
            return tokenizer.encode(prompt.text, add_special_tokens=True)
        return list(prompt.token_ids)

    @router.post("/tokenize")
    @_converted
    async def tokenize(request: Request) -> dict:
        kind = await parse_body(request, _TokenizeKind)
        if (kind.prompt is None) == (kind.messages is None):
            raise bad_request("give either `prompt` (a string) or `messages` (a chat)")
        body: TokenizeChatRequest | TokenizeCompletionRequest
        if kind.messages is not None:
            body = await parse_body(request, TokenizeChatRequest)
            ctx.check_model(body.model)
            ids = chat_tokens(body)
        else:
            body = await parse_body(request, TokenizeCompletionRequest)
            ctx.check_model(body.model)
            ids = tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {
            "count": len(ids),
            "max_model_len": ctx.model.max_context_tokens,
            "tokens": ids,
            "token_strs": strs,
        }

    @router.post("/detokenize")
    @_converted
    async def detokenize(request: Request) -> dict:
        body = await parse_body(request, DetokenizeRequest)
        ctx.check_model(body.model)
        _check_vocab(body.tokens, tokenizer, "tokens")
        return {"prompt": tokenizer.decode(body.tokens, skip_special_tokens=False)}

    @router.post("/v1/chat/completions/render")
    @_converted
    async def render_chat_completion(request: Request) -> dict:
        body = await parse_body(request, ChatCompletionRequest)
        ctx.check_model(body.model)
        prompt = render_chat(body, ctx.model)
        max_tokens = output_budget(len(prompt.token_ids), body.output_budget, ctx.model)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        params = sampling_params(
            body,
            max_tokens,
            logprobs,
            skip_special_tokens=prompt.skip_special_tokens,
            prompt=prompt,
        )
        return _generate_request("chatcmpl", list(prompt.token_ids), params, body)

    @router.post("/v1/completions/render")
    @_converted
    async def render_completion(request: Request) -> list[dict]:
        body = await parse_body(request, CompletionRequest)
        ctx.check_model(body.model)
        out = []
        for index, prompt in enumerate(body.prompts()):
            ids = prompt_ids(prompt, index, tokenizer)
            params = completion_params(body, ids, ctx)
            out.append(_generate_request("cmpl", ids, params, body))
        return out

    return router
