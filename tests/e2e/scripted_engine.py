"""A fake AsyncEngine that "generates" scripted text, to test the HTTP layer without a model.

Random tiny models never write a tool call, so tool-call, reasoning and
error paths are tested by scripting what the engine emits: each request
takes the next `Script` (or the default one) and streams its pieces as
RequestOutputs, one piece per output, exactly as the real engine shapes them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from engine.errors import EngineOverloadedError
from engine.requests.outputs import CompletionOutput, RequestOutput
from engine.requests.params import SamplingParams
from engine.requests.sequence import TokenLogprob


@dataclass
class Script:
    pieces: list[str]
    finish_reason: str = "stop"
    cached_tokens: int = 0
    overloaded: bool = False  # refuse the request as a full queue would
    error: str | None = None  # end with finish_reason "error" and this message
    delay: float = 0.0  # seconds between pieces


@dataclass
class Submitted:
    prompt: list[int]
    params: SamplingParams
    request_id: str
    cache_salt: str


@dataclass
class ScriptedEngine:
    default: Script = field(default_factory=lambda: Script(["Hello", " there", "."]))
    queue: deque = field(default_factory=deque)
    submitted: list[Submitted] = field(default_factory=list)
    active: set = field(default_factory=set)

    def push(self, *scripts: Script) -> None:
        self.queue.extend(scripts)

    async def stats(self) -> dict:
        return {
            "kv_cache_dtype": "fp8_e4m3",
            "capacity_tokens": 4096,
            "used_tokens": 16 * len(self.active),
            "cached_tokens": 0,
            "cache_hit_rate": 0.0,
            "max_context_tokens": 512,
            "kv_scales": {"source": "none", "k": [1.0], "v": [1.0]},
            "running": len(self.active),
            "waiting": 0,
        }

    async def generate(self, prompt, params: SamplingParams, request_id: str, cache_salt: str = ""):
        script = self.queue.popleft() if self.queue else self.default
        self.submitted.append(Submitted(list(prompt), params, request_id, cache_salt))
        await asyncio.sleep(0)
        if script.overloaded:
            raise EngineOverloadedError("3 requests are already waiting; retry shortly")
        self.active.add(request_id)
        text, ids, logprobs = "", [], []
        try:
            pieces = script.pieces or [""]
            for number, piece in enumerate(pieces):
                last = number == len(pieces) - 1
                token = 10 + number
                text += piece
                ids.append(token)
                logprobs.append(TokenLogprob(token, -0.5, {token: -0.5, 11: -1.5}))
                reason = None
                if last:
                    reason = "error" if script.error else script.finish_reason
                completion = CompletionOutput(
                    index=0,
                    text=text,
                    token_ids=list(ids),
                    logprobs=list(logprobs) if params.logprobs is not None else None,
                    finish_reason=reason,
                    delta_text=piece,
                    delta_token_ids=[token],
                )
                yield RequestOutput(
                    request_id=request_id,
                    prompt=None,
                    prompt_token_ids=list(prompt),
                    outputs=[completion],
                    finished=last,
                    num_cached_tokens=script.cached_tokens,
                    error=script.error if last else None,
                )
                await asyncio.sleep(script.delay)
        finally:
            self.active.discard(request_id)
