"""The default model (SmolLM2-135M-Instruct) served over HTTP, with BF16 and FP8 KV.

Through the official openai client, as an agent in attach mode would talk to
`resident serve`. Outputs are kept short (max_tokens <= 8) so the suite stays
quick on a 2-core CPU.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import openai
import pytest

from tests.e2e.conftest import client_for

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def stats(server) -> dict:
    return httpx.get(server.url + "/v1/engine/stats", timeout=30).json()


def wait_until_idle(server, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        current = stats(server)
        if current["running"] == 0 and current["used_tokens"] == 0:
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"the engine did not go idle: {current}")
        time.sleep(0.1)


def test_chat_non_streaming_and_streaming(default_server):
    client = client_for(default_server, api_key=None)
    reply = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=8, temperature=0
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert "<|im_end|>" not in choice.message.content
    assert "<|im_start|>" not in choice.message.content
    assert reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens

    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() and "<|im_end|>" not in text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert 0 < chunks[-1].usage.completion_tokens <= 8
    assert chunks[-1].usage.prompt_tokens == reply.usage.prompt_tokens


def test_completions_token_ids_echo_and_prompt_logprobs(default_server):
    tokenizer = default_server.engine.tokenizer
    prompt = "The capital of France is"
    ids = tokenizer.encode(prompt)
    client = client_for(default_server, api_key=None)
    reply = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=4, temperature=0, echo=True, logprobs=2
    )
    choice = reply.choices[0]
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    logprobs = choice.logprobs
    generated = reply.usage.completion_tokens
    assert reply.usage.prompt_tokens == len(ids)
    assert len(logprobs.tokens) == len(ids) + generated
    assert "".join(logprobs.tokens[: len(ids)]) == prompt
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(value <= 0 for value in logprobs.token_logprobs[1:])
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs[1:])
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    # Greedy: each generated token is its position's most likely one.
    for token, value, top in list(
        zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True)
    )[len(ids) :]:
        assert value == pytest.approx(max(top.values()), abs=1e-4), token

    plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0)
    assert plain.choices[0].text == choice.text[len(prompt) :]


def test_32_concurrent_streams_all_finish(fp8_server):
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None]:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Give me a fact about the number {i}."}],
            max_tokens=8,
            temperature=0.7,
            seed=i,
            stream=True,
        )
        text, finish = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def run() -> list[tuple[str, str | None]]:
        client = openai.AsyncOpenAI(
            base_url=fp8_server.url + "/v1", api_key="unused", max_retries=0, timeout=300
        )
        async with client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    results = asyncio.run(run())
    assert len(results) == 32
    assert all(finish in ("stop", "length") for _, finish in results), results
    assert sum(1 for text, _ in results if text) >= 30
    wait_until_idle(fp8_server)


def test_repeated_long_prefix_reports_cached_tokens(fp8_server):
    client = client_for(fp8_server, api_key=None)
    # Unique, so no earlier test has cached it; about 300 tokens (prefill is slow on CPU).
    system = f"Session {uuid.uuid4().hex}. " + "You answer questions about Python. " * 40

    def ask(question: str, salt: str | None = None):
        extra = {"cache_salt": salt} if salt else None
        return client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=2,
            temperature=0,
            extra_body=extra,
        ).usage

    cold = ask("What is a list?")
    assert cold.prompt_tokens > 250
    assert cold.prompt_tokens_details.cached_tokens < 16
    warm = ask("What is a dict?")
    assert warm.prompt_tokens_details.cached_tokens >= cold.prompt_tokens - 32
    # Another tenant's salt shares nothing.
    other = ask("What is a dict?", salt="another-tenant")
    assert other.prompt_tokens_details.cached_tokens < 16


def test_client_disconnect_frees_pages(fp8_server):
    baseline = wait_until_idle(fp8_server)
    body = {
        "model": MODEL,
        "messages": QUESTION,
        "max_tokens": 500,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST", fp8_server.url + "/v1/chat/completions", json=body, timeout=60
    ) as response:
        assert response.status_code == 200
        lines = (line for line in response.iter_lines() if line.startswith("data: "))
        for _ in range(4):
            next(lines)
        during = stats(fp8_server)
        assert during["running"] == 1 and during["used_tokens"] > baseline["used_tokens"]
    after = wait_until_idle(fp8_server, timeout=60)
    assert after["used_tokens"] == baseline["used_tokens"]


def test_models_stats_and_metrics(default_server):
    models = client_for(default_server, api_key=None).models.list()
    assert [m.id for m in models.data] == [MODEL]
    current = stats(default_server)
    expected_dtype = default_server.engine.config.kv_cache_dtype
    assert current["kv_cache_dtype"] == expected_dtype
    for key in ("capacity_tokens", "used_tokens", "cached_tokens", "cache_hit_rate"):
        assert key in current
    assert current["max_context_tokens"] == 8192
    assert len(current["kv_scales"]["k"]) == len(current["kv_scales"]["v"]) == 30
    if expected_dtype == "fp8_e4m3":  # set at start-up as serve sets them, not by a request
        assert current["kv_scales"]["source"] == "sample"
    # Which matrix instructions the CPU path may use, and the engine thread's team.
    from engine.host.cpu_features import cpu_features
    from engine.host.threads import usable_cores

    assert current["cpu_matrix_isa"] == cpu_features().matrix_isa
    assert current["cpu_features"]["amx_tile"] == cpu_features().amx_tile
    assert 1 <= current["compute_threads"] <= usable_cores()
    metrics = httpx.get(default_server.url + "/metrics", timeout=60).text
    for name in (
        "resident_http_requests_total",
        "resident_prompt_tokens_total",
        "resident_generation_tokens_total",
        "resident_kv_used_tokens",
        "resident_kv_capacity_tokens",
        "resident_prefix_cache_hit_rate",
        "resident_requests_waiting",
        "resident_time_to_first_token_seconds_bucket",
        "resident_inter_token_latency_seconds_bucket",
    ):
        assert name in metrics, name
