"""LocalClient: the in-process engine (AsyncEngine) behind the LLMClient interface.

Besides generating, it keeps the resident prefix pinned: after a request, the
tokens of the leading messages the request marks as resident (system prompt
and repository snapshot) are pinned in the engine's prefix cache, so later
turns prefill only what is new even under memory pressure. A new epoch (a
different prefix) unpins the old one.

The resident prefix also outlives the process (the engine's disk tier): before
the first request of a session or an epoch, its saved pages are restored, so
a second session on the same repository state skips the prefill; once an
epoch's prefix is first complete, and when the session ends, it is saved.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

from agent.core.clients.base import (
    ChatRequest,
    Completion,
    ContextOverflowError,
    EngineFailure,
    LLMClient,
    StreamItem,
    TokenUsage,
    TransientError,
)
from agent.core.clients.engine_profile import LOCAL_DEFAULT_MODEL, local_engine_settings
from agent.core.clients.structured import tool_call_constraint
from agent.core.valid_unicode import valid_json
from engine.chat import (
    ContentDelta,
    ReasoningDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallError,
)
from engine.errors import EngineError, EngineOverloadedError, PromptTooLongError
from engine.rendering import ChatRenderer, ChatRenderError, RenderedChat
from engine.requests.params import SamplingParams

log = logging.getLogger(__name__)


def start_engine(model: str, **config: Any) -> Any:
    """An AsyncEngine for `model` (a name, a model folder or a .gguf file), with the
    settings the agent chooses (engine_profile.py says which, and why) unless `config`
    gives others."""
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    # Not AsyncEngine.open: the agent's first request is its system prompt and the
    # resident repository, thousands of tokens, so FP8 scales set from that first
    # prefill are sound, and start-up stays a few seconds shorter.
    settings = {**local_engine_settings(), **config}
    return AsyncEngine(EngineConfig(model=model, **settings))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class LocalClient(LLMClient):
    token_count_method = "tokenizer"

    def __init__(self, engine: Any, model: str, *, cache_salt: str = "", owns_engine: bool = False):
        self.engine = engine
        self.model = model
        self.cache_salt = cache_salt
        self.owns_engine = owns_engine
        model_dir = getattr(getattr(engine, "engine", None), "model_dir", None)
        # The engine's renderer, as the server and LLM.chat use it: same prompt, same parser.
        self.renderer = ChatRenderer.for_model_dir(engine.tokenizer, model_dir)
        self._ids = itertools.count()
        self._session = secrets.token_hex(4)
        self._pinned_ids: list[int] = []
        self._pin_handle: Any = None
        self._window: int | None = None

    @classmethod
    def start(cls, model: str | None = None, **config: Any) -> LocalClient:
        """A client with its own engine for `model`; None: the engine's default model."""
        model = model or LOCAL_DEFAULT_MODEL
        try:
            engine = start_engine(model, **config)
        except EngineError as err:  # e.g. a model not pulled yet: the message says how
            raise EngineFailure(str(err)) from err
        try:
            return cls(engine, model, owns_engine=True)
        except ChatRenderError as err:  # no chat template: it cannot run the agent
            engine.shutdown()
            raise EngineFailure(f"{model}: {err}, so it cannot run the agent") from err

    def describe(self) -> str:
        return f"{self.model} (local engine)"

    def engine_settings(self) -> dict[str, Any]:
        """The settings the engine runs with, as a server's /v1/engine/stats gives them."""
        config = getattr(getattr(self.engine, "engine", None), "config", None)
        return config.model_dump(mode="json") if config is not None else {}

    def count_tokens(self, text: str) -> int:
        return len(self.renderer.encode(text))

    async def context_window(self) -> int:
        # Both limits are fixed when the engine starts, so asking once is enough.
        if self._window is None:
            stats = await self.engine.stats()
            keys = ("max_context_tokens", "capacity_tokens")
            self._window = min(int(stats[k]) for k in keys if stats.get(k))
        return self._window

    async def aclose(self) -> None:
        if self._pinned_ids:
            await self._disk("save_prefix", self._pinned_ids)  # refreshes its place in the LRU
        await self._unpin()
        if self.owns_engine:
            self.engine.shutdown()

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamItem]:
        # The tokenizer takes no lone surrogate (a file name that is not UTF-8 in the
        # snapshot, say): the prompt is valid Unicode first (agent/core/valid_unicode.py).
        request = dataclasses.replace(
            request, messages=valid_json(request.messages), tools=valid_json(request.tools)
        )
        try:
            prompt = self.renderer.render(request.messages, request.tools)
        except ChatRenderError as err:
            raise EngineFailure(str(err)) from err
        window = await self.context_window()
        room = window - len(prompt.token_ids)
        if room < 1:
            raise ContextOverflowError(
                f"the prompt has {len(prompt.token_ids)} tokens but the context window holds {window}"
            )
        params = SamplingParams(
            max_tokens=min(room, request.max_tokens or room),
            temperature=0.0 if request.temperature is None else request.temperature,
            skip_special_tokens=prompt.skip_special_tokens,
            structured=tool_call_constraint(prompt),  # a call the model opens must end valid
        )
        resident = self._resident_ids(request, prompt) if request.pinned_messages else []
        if resident and resident != self._pinned_ids:
            await self._disk("restore_prefix", resident)
        async for item in self._generate(prompt, params):
            yield item
        if resident:
            await self._pin(resident)

    async def _generate(
        self, prompt: RenderedChat, params: SamplingParams
    ) -> AsyncIterator[StreamItem]:
        # Calls are held until complete, so a malformed one is never half-announced.
        parser = prompt.output_parser()
        pending: dict[int, list[Any]] = {}  # index -> [id, name, argument pieces]
        request_id = f"agent-{self._session}-{next(self._ids)}"
        last = None
        try:
            async for output in self.engine.generate(
                prompt.token_ids, params, request_id, cache_salt=self.cache_salt
            ):
                last = output
                completion = output.outputs[0]
                if completion.finish_reason == "error":
                    raise EngineFailure(f"the engine failed: {output.error or 'unknown error'}")
                for event in parser.feed(prompt.clean(completion.delta_text)):
                    for item in _translate(event, pending):
                        yield item
        except PromptTooLongError as err:
            raise ContextOverflowError(str(err)) from err
        except EngineOverloadedError as err:
            raise TransientError(f"the engine is overloaded: {err}") from err
        except EngineError as err:
            raise EngineFailure(str(err)) from err
        except RuntimeError as err:  # EngineDeadError and the like
            raise EngineFailure(f"the engine stopped: {err}") from err
        for event in parser.finish():
            for item in _translate(event, pending):
                yield item
        if last is None:
            raise EngineFailure("the engine returned nothing for the request")
        completion = last.outputs[0]
        yield Completion(
            finish_reason=completion.finish_reason or "stop",
            usage=TokenUsage(
                prompt_tokens=len(last.prompt_token_ids),
                completion_tokens=len(completion.token_ids),
                cached_tokens=last.num_cached_tokens,
            ),
        )

    def _resident_ids(self, request: ChatRequest, prompt: RenderedChat) -> list[int]:
        """The prompt's tokens that the resident messages (system prompt, snapshot) make."""
        prefix_text = self.renderer.render_text(
            request.messages[: request.pinned_messages], request.tools, add_generation_prompt=False
        )
        prefix = self.renderer.encode(prefix_text)
        return prompt.token_ids[: _common_prefix(prefix, prompt.token_ids)]

    async def _pin(self, ids: list[int]) -> None:
        if ids == self._pinned_ids:
            return
        await self._unpin()
        self._pin_handle = await self.engine.pin_prefix(ids, self.cache_salt)
        self._pinned_ids = ids
        log.debug("pinned a resident prefix of %d tokens", len(ids))
        await self._disk("save_prefix", ids)  # the epoch's prefix is complete: keep it

    async def _disk(self, method: str, ids: list[int]) -> None:
        """Save or restore a prefix in the engine's disk tier; a failure costs a prefill
        later, never the turn."""
        call = getattr(self.engine, method, None)
        if call is None:
            return
        try:
            result = await call(ids, self.cache_salt)
        except Exception as err:  # a full disk, a read-only cache, a stopped engine
            log.warning("KV disk tier: %s failed: %s", method, err)
            return
        log.debug("KV disk tier: %s of %d tokens: %s", method, len(ids), result)

    async def _unpin(self) -> None:
        if self._pin_handle is None:
            return
        handle, self._pin_handle, self._pinned_ids = self._pin_handle, None, []
        try:
            await self.engine.unpin_prefix(handle)
        except RuntimeError:
            pass  # the engine is gone, and its pins with it


def _translate(event: Any, pending: dict[int, list[Any]]) -> list[StreamItem]:
    """Engine chat events as client stream items: the same words (base.py), with a
    tool call's pieces held back until it is complete."""
    if isinstance(event, ContentDelta | ReasoningDelta):
        return [event] if event.text else []
    if isinstance(event, ToolCallDelta):
        if event.id is not None:
            pending[event.index] = [event.id, event.name or "", [event.arguments]]
        elif event.index in pending:
            pending[event.index][2].append(event.arguments)
        return []
    if isinstance(event, ToolCallEnd):
        call = pending.pop(event.index, None)
        if call is None:
            return []
        return [ToolCall(id=call[0], name=call[1], arguments_json="".join(call[2]))]
    if isinstance(event, ToolCallError):
        if event.index is not None:
            pending.pop(event.index, None)
        return [ToolCallError(event.message)]  # names no call: none was yielded
    return []
