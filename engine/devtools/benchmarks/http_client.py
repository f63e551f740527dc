"""A minimal streaming chat client for the serving benchmarks: times every token it receives.

httpx and a few lines of SSE parsing rather than the openai client, so that
the benchmark measures the server and runs where only the engine is installed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class StreamTiming:
    start: float
    first_chunk: float | None = None  # the role chunk: sent once the first token exists
    token_times: list[float] = field(default_factory=list)
    text: str = ""
    usage: dict | None = None

    @property
    def ttft(self) -> float:
        return (self.first_chunk or self.start) - self.start

    @property
    def latency(self) -> float:
        end = self.token_times[-1] if self.token_times else self.first_chunk or self.start
        return end - self.start


async def stream_chat(client: httpx.AsyncClient, body: dict) -> StreamTiming:
    """POST a streaming chat completion and time its chunks."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    timing = StreamTiming(start=time.perf_counter())
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread()).decode()}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if timing.first_chunk is None:
                timing.first_chunk = now
            if chunk.get("usage"):
                timing.usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                content = choice["delta"].get("content")
                if content:
                    timing.text += content
                    timing.token_times.append(now)
    return timing
