"""Bad requests get OpenAI-style 4xx errors, and never stop the server serving good ones.

Against a tiny random checkpoint (context 512) behind the real engine and an
API key, so every case runs through the same code as with a real model.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.e2e.conftest import client_for
from tests.e2e.fixtures import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "def add(a, b):"}]


def post(server, path: str, body, headers=AUTH) -> httpx.Response:
    if isinstance(body, bytes | str):
        return httpx.post(server.url + path, content=body, headers=headers, timeout=60)
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_good_requests_work(tiny_server):
    client = client_for(tiny_server)
    reply = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length")
    completion = client.completions.create(model="tiny-llama", prompt=[5, 6, 7], max_tokens=3)
    assert completion.usage.prompt_tokens == 3
    # Serve's start-up calibration ran (AsyncEngine.open), so no request set the FP8 scales.
    stats = httpx.get(tiny_server.url + "/v1/engine/stats", headers=AUTH, timeout=60).json()
    assert stats["kv_scales"]["source"] == "sample"


def test_missing_or_wrong_api_key_is_401(tiny_server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = post(tiny_server, CHAT, {"messages": MESSAGES}, headers=headers)
        assert_error(response, 401)
        assert response.json()["error"]["type"] == "authentication_error"
    for path in ("/v1/models", "/metrics", "/v1/engine/stats"):
        assert httpx.get(tiny_server.url + path, timeout=60).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        client_for(tiny_server, api_key="wrong").models.list()
    assert httpx.get(tiny_server.url + "/health", timeout=60).status_code == 200  # open by design


def test_bad_json_is_400(tiny_server):
    assert_error(post(tiny_server, CHAT, b"{not json"), 400)
    assert_error(post(tiny_server, CHAT, b"[1, 2]"), 400)
    assert_error(post(tiny_server, COMPLETIONS, "\xff\xfe"), 400)


def test_unknown_model_is_404(tiny_server):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client_for(tiny_server).chat.completions.create(model="gpt-9", messages=MESSAGES)
    error = assert_error(post(tiny_server, COMPLETIONS, {"model": "gpt-9", "prompt": "x"}), 404)
    assert error["code"] == "model_not_found"


def test_prompt_longer_than_context_names_both_numbers(tiny_server):
    long_ids = list(range(5, 305)) * 2  # 600 tokens, context 512
    error = assert_error(post(tiny_server, COMPLETIONS, {"prompt": long_ids, "max_tokens": 4}), 400)
    assert "600" in error["message"] and "512" in error["message"]
    assert error["code"] == "context_length_exceeded"
    # Fits alone, but not with the output asked for: both numbers, and their sum.
    body = {"prompt": list(range(5, 305)), "max_tokens": 300}
    error = assert_error(post(tiny_server, COMPLETIONS, body), 400, param="max_tokens")
    assert "300" in error["message"] and "600" in error["message"] and "512" in error["message"]
    long_text = "import os\n" * 400
    body = {"messages": [{"role": "user", "content": long_text}], "max_tokens": 8}
    error = assert_error(post(tiny_server, CHAT, body), 400)
    assert "512" in error["message"]


@pytest.mark.parametrize(
    "path, fields, param",
    [
        (CHAT, {"temperature": -0.5}, "temperature"),
        (CHAT, {"top_p": 0}, "top_p"),
        (CHAT, {"top_p": 1.5}, "top_p"),
        (CHAT, {"n": 0}, "n"),
        (CHAT, {"n": 1000}, "n"),
        (CHAT, {"max_tokens": 0}, "max_tokens"),
        (CHAT, {"max_completion_tokens": -3}, "max_completion_tokens"),
        (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (CHAT, {"presence_penalty": 3}, "presence_penalty"),
        (CHAT, {"frequency_penalty": -2.5}, "frequency_penalty"),
        (CHAT, {"repetition_penalty": 0}, "repetition_penalty"),
        (CHAT, {"top_k": -2}, "top_k"),
        (CHAT, {"messages": []}, "messages"),
        (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, None),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None),
        (CHAT, {"tool_choice": "required"}, "tools"),
        (CHAT, {"tool_choice": "sometimes"}, None),
        (CHAT, {"logit_bias": {"5": 10}}, None),
        (CHAT, {"response_format": {"type": "json_schema"}}, None),
        (CHAT, {"stream": "yes please"}, "stream"),
        (COMPLETIONS, {"logprobs": 21}, "logprobs"),
        (COMPLETIONS, {"logprobs": -1}, "logprobs"),
        (COMPLETIONS, {"max_tokens": 0}, "max_tokens"),
        (COMPLETIONS, {"temperature": -1}, "temperature"),
        (COMPLETIONS, {"prompt": []}, None),
        (COMPLETIONS, {"prompt": [[]]}, "prompt"),
        (COMPLETIONS, {"prompt": [1, 2, 999999]}, None),
        (COMPLETIONS, {"prompt": [-1]}, None),
        (COMPLETIONS, {"prompt": {"text": "hi"}}, None),
        (COMPLETIONS, {"suffix": "end"}, None),
        (COMPLETIONS, {"best_of": 3}, None),
    ],
)
def test_impossible_values_are_400(tiny_server, path, fields, param):
    body = {"model": "tiny-llama", "max_tokens": 4, **fields}
    body.setdefault("messages" if path == CHAT else "prompt", MESSAGES if path == CHAT else "x")
    assert_error(post(tiny_server, path, body), 400, param=param)


def test_openai_client_surfaces_400(tiny_server):
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client_for(tiny_server).chat.completions.create(
            model="tiny-llama", messages=MESSAGES, temperature=-1
        )


def test_a_flood_of_bad_requests_leaves_good_ones_served(tiny_server):
    bad_bodies = [
        b"{",
        b'{"messages": 5}',
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": -1}',
        b'{"prompt": [1, 2, 999999], "max_tokens": 2}',
        b'{"prompt": "x", "max_tokens": 100000}',
        b'{"model": "nope", "prompt": "x"}',
    ]

    async def flood() -> tuple[list[int], list[int]]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=tiny_server.url, limits=limits, timeout=120) as http:

            async def bad(i: int) -> int:
                path = CHAT if i % 2 else COMPLETIONS
                body = bad_bodies[i % len(bad_bodies)]
                return (await http.post(path, content=body, headers=AUTH)).status_code

            async def good(i: int) -> int:
                body = {"prompt": f"def f{i}(x):", "max_tokens": 3, "temperature": 0}
                return (await http.post(COMPLETIONS, json=body, headers=AUTH)).status_code

            bad_tasks = [bad(i) for i in range(300)]
            good_tasks = [good(i) for i in range(8)]
            results = await asyncio.gather(*bad_tasks, *good_tasks)
            return list(results[:300]), list(results[300:])

    bad_codes, good_codes = asyncio.run(flood())
    assert all(400 <= code < 500 for code in bad_codes), sorted(set(bad_codes))
    assert good_codes == [200] * 8
    assert httpx.get(tiny_server.url + "/health", timeout=60).status_code == 200
    reply = client_for(tiny_server).completions.create(model="tiny-llama", prompt="x", max_tokens=2)
    assert reply.choices[0].text is not None
    stats = httpx.get(tiny_server.url + "/v1/engine/stats", headers=AUTH, timeout=60).json()
    assert stats["running"] == 0 and stats["waiting"] == 0 and stats["used_tokens"] == 0
