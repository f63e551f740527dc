"""resident serve --deterministic: a request's greedy output is the same alone, in a batch of
32 concurrent requests, cold or from the prefix cache (default model, BF16 and FP8 KV)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import _engine_server, client_for
from tests.e2e.fixtures import default_model_present

MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "What is a hash map?",
    "Name three sorting algorithms.",
    "What does git rebase do?",
    "Explain recursion briefly.",
]
PREFIX = "You review Python code carefully. " + " ".join(
    f"Rule {i}: keep functions short and names clear." for i in range(40)
)


def _scales_file(folder) -> str:
    """FP8 scales calibrated on the fast path. Without fixed scales a server calibrates
    on its 4,096-token built-in sample at start, which in deterministic mode (tiled
    products, the torch attention backend) takes half a minute here; what this module
    checks holds for any fixed scales."""
    from engine import LLM

    path = folder / "scales.json"
    LLM(MODEL, kv_cache_dtype="fp8_e4m3").calibrate_kv_scales([PREFIX + " " + QUESTIONS[0]], path)
    return str(path)


@pytest.fixture(scope="module", params=["bf16", "fp8_e4m3"])
def det_server(request, tmp_path_factory):
    if not default_model_present():
        pytest.skip("the default model is not pulled (run `resident models pull` / make setup)")
    fixed = {}
    if request.param == "fp8_e4m3":
        fixed["kv_scales_file"] = _scales_file(tmp_path_factory.mktemp("scales"))
    server = _engine_server(
        MODEL, None, kv_cache_dtype=request.param, kv_memory_gib=0.25, deterministic=True, **fixed
    )
    with server:
        client = client_for(server, api_key=None)
        _ask(client, "warm up", salt="warm-up")  # one-time costs (kernel builds) go first
        yield client
    server.engine.shutdown()


def _ask(client, question: str, salt: str, system: str | None = None):
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        extra_body={"cache_salt": salt, "ignore_eos": True},
    )
    choice = reply.choices[0]
    return choice.message.content, [t.logprob for t in choice.logprobs.content], reply.usage


def test_alone_equals_batch_of_32(det_server):
    alone = {q: _ask(det_server, q, salt=f"alone-{i}")[:2] for i, q in enumerate(QUESTIONS)}
    jobs = [(QUESTIONS[i % len(QUESTIONS)], f"batch-{i}") for i in range(32)]
    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(lambda job: (job[0], _ask(det_server, *job)[:2]), jobs))
    for question, result in results:
        assert result == alone[question], question


def test_cached_prefix_equals_cold(det_server):
    cold_text, cold_logprobs, cold_usage = _ask(det_server, QUESTIONS[0], "cold", PREFIX)
    assert cold_usage.prompt_tokens_details.cached_tokens == 0
    _ask(det_server, QUESTIONS[1], "shared", PREFIX)  # fills the cache for this salt
    text, logprobs, usage = _ask(det_server, QUESTIONS[0], "shared", PREFIX)
    assert usage.prompt_tokens_details.cached_tokens > 200
    assert (text, logprobs) == (cold_text, cold_logprobs)
