"""Token ids without generating (engine/server/tokenize_routes.py) and KV-event discovery,
on a real server over a tiny random checkpoint: vLLM's shapes, the ids equal to what the
generating routes prefill (so a router's block hashes match the engine's), the API key,
and OpenAI-style 400s for bad input."""

from __future__ import annotations

import httpx
import openai
import pytest

from engine.kv.kv_events import parse_kv_events
from tests.e2e.fixtures import API_KEY, WEATHER_TOOL
from tests.e2e.replicas import http_counts, replica
from tests.engine import checkpoints

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "tiny-tokenize"
CONTEXT = 2048  # room for a chat with tools written into its system message
SYSTEM = "You work in this repository.\n" + "".join(
    f"src/mod{i}.py: def fn{i}(x): return x + {i}\n" for i in range(12)
)
CHAT = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Where is fn7 defined?"},
]
ROUTES = ("/tokenize", "/detokenize", "/v1/chat/completions/render", "/v1/completions/render")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenize") / MODEL
    return checkpoints.tiny_llama(folder, max_position_embeddings=CONTEXT)


@pytest.fixture(scope="module")
def server(model_dir):
    config = dict(kv_cache_dtype="fp8_e4m3", kv_memory_gib=0.01, max_num_seqs=4)
    with replica(model_dir, API_KEY, **config) as served:
        yield served


def post(server, path: str, body, headers=AUTH) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


def ok(server, path: str, body) -> dict | list:
    reply = post(server, path, body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def error(server, path: str, body, status: int = 400) -> dict:
    reply = post(server, path, body)
    assert reply.status_code == status, reply.text
    return reply.json()["error"]


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def tokenizer(server):
    return server.engine.engine.tokenizer


def test_tokenize_a_prompt_in_vllms_shape(server):
    text = "def fn(x): return x + 1\n"
    reply = ok(server, "/tokenize", {"model": MODEL, "prompt": text})
    assert set(reply) == {"count", "max_model_len", "tokens", "token_strs"}
    assert reply["tokens"] == tokenizer(server).encode(text)
    assert reply["count"] == len(reply["tokens"]) and reply["token_strs"] is None
    models = httpx.get(server.url + "/v1/models", headers=AUTH, timeout=30).json()
    assert reply["max_model_len"] == models["data"][0]["max_model_len"] == CONTEXT
    strs = ok(server, "/tokenize", {"prompt": text, "return_token_strs": True})["token_strs"]
    assert strs == tokenizer(server).convert_ids_to_tokens(reply["tokens"])
    usage = client(server).completions.create(model=MODEL, prompt=text, max_tokens=1).usage
    assert usage.prompt_tokens == reply["count"]  # what the completion prefilled


def test_tokenize_a_chat_counts_what_the_chat_request_prefills(server):
    for tools in (None, [WEATHER_TOOL]):
        body = {"model": MODEL, "messages": CHAT} | ({"tools": tools} if tools else {})
        tokens = ok(server, "/tokenize", body)
        extra = {"tools": tools} if tools else {}
        answer = client(server).chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=1, temperature=0, **extra
        )
        assert tokens["count"] == answer.usage.prompt_tokens, tools
        rendered = ok(server, "/v1/chat/completions/render", body | {"max_tokens": 1})
        assert rendered["token_ids"] == tokens["tokens"]
    # The ids are the very prompt that was prefilled: sent back as a token-id completion
    # they find every full page of the chat cached.
    ids = ok(server, "/tokenize", {"messages": CHAT})["tokens"]
    again = client(server).completions.create(model=MODEL, prompt=ids, max_tokens=1)
    assert again.usage.prompt_tokens_details.cached_tokens == len(ids) // 16 * 16 > 0


def test_the_generation_prompt_and_a_continued_message(server):
    whole = ok(server, "/tokenize", {"messages": CHAT})["tokens"]
    bare = ok(server, "/tokenize", {"messages": CHAT, "add_generation_prompt": False})["tokens"]
    assert whole[: len(bare)] == bare and len(bare) < len(whole)
    assert tokenizer(server).decode(whole[len(bare) :]) == "<|im_start|>assistant\n"
    begun = CHAT + [{"role": "assistant", "content": "In src/mod7"}]
    continued = ok(server, "/tokenize", {"messages": begun, "continue_final_message": True})
    assert tokenizer(server).decode(continued["tokens"]).endswith("In src/mod7")
    with_bos = ok(server, "/tokenize", {"messages": CHAT, "add_special_tokens": True})["tokens"]
    assert with_bos[-len(whole) :] == whole  # special tokens only ever in front
    both = {"messages": begun, "continue_final_message": True, "add_generation_prompt": True}
    assert "add_generation_prompt" in error(server, "/tokenize", both)["message"]
    after_user = {"messages": CHAT, "continue_final_message": True}
    assert "assistant" in error(server, "/tokenize", after_user)["message"]


def test_detokenize_round_trips(server):
    ids = ok(server, "/tokenize", {"messages": CHAT})["tokens"]
    text = ok(server, "/detokenize", {"model": MODEL, "tokens": ids})["prompt"]
    assert text.startswith("<|im_start|>system\n") and SYSTEM in text  # specials kept
    assert ok(server, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"] == ids
    outside = error(server, "/detokenize", {"tokens": [1, 320]})
    assert outside["param"] == "tokens" and "vocabulary" in outside["message"]
    assert error(server, "/detokenize", {"tokens": [-1]})["param"] == "tokens.0"
    assert error(server, "/detokenize", {"tokens": "abc"})["param"] == "tokens"


def test_render_answers_vllms_generate_requests(server):
    chat = ok(
        server,
        "/v1/chat/completions/render",
        {"model": MODEL, "messages": CHAT, "max_tokens": 7, "temperature": 0.5, "seed": 3},
    )
    assert chat["request_id"].startswith("chatcmpl-") and chat["features"] is None
    assert chat["model"] == MODEL and chat["stream"] is False and chat["priority"] == 0
    params = chat["sampling_params"]
    assert (params["max_tokens"], params["temperature"], params["seed"]) == (7, 0.5, 3)
    # No max_tokens: all the room the context leaves, as the chat route would give.
    room = ok(server, "/v1/chat/completions/render", {"messages": CHAT})["sampling_params"]
    assert room["max_tokens"] == CONTEXT - len(chat["token_ids"])

    text = "def fn(x):"
    batch = ok(server, "/v1/completions/render", {"model": MODEL, "prompt": [text, "x = 1"]})
    encode = tokenizer(server).encode
    assert [item["token_ids"] for item in batch] == [encode(text), encode("x = 1")]
    ids = ok(server, "/v1/completions/render", {"prompt": [[5, 6, 7], [8]]})
    assert [item["token_ids"] for item in ids] == [[5, 6, 7], [8]]
    assert all(item["request_id"].startswith("cmpl-") for item in batch)
    assert batch[0]["sampling_params"]["max_tokens"] == 16  # completions' default
    single = ok(server, "/v1/completions/render", {"prompt": text})
    assert isinstance(single, list) and len(single) == 1


def test_bad_input_is_an_openai_400(server):
    assert "prompt" in error(server, "/tokenize", {"model": MODEL})["message"]
    assert "either" in error(server, "/tokenize", {"prompt": "a", "messages": CHAT})["message"]
    assert error(server, "/tokenize", {"prompt": ["a", "b"]})["param"] == "prompt"
    assert error(server, "/tokenize", {"messages": []})["param"] == "messages"
    template = {"messages": CHAT, "chat_template": "{{ messages }}"}
    assert error(server, "/tokenize", template)["param"] == "chat_template"
    unknown = error(server, "/tokenize", {"model": "other", "prompt": "a"}, status=404)
    assert unknown["code"] == "model_not_found"
    bad_tool = {"messages": CHAT, "tools": [{"type": "function", "function": {"name": ""}}]}
    assert error(server, "/tokenize", bad_tool)["param"].startswith("tools.0")
    reply = httpx.post(server.url + "/tokenize", content=b"{not json", headers=AUTH, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"

    long_chat = [{"role": "user", "content": "x " * CONTEXT}]
    assert ok(server, "/tokenize", {"messages": long_chat})["count"] > CONTEXT  # as vLLM: counted
    too_long = error(server, "/v1/chat/completions/render", {"messages": long_chat})
    assert too_long["code"] == "context_length_exceeded"  # as the chat route would answer
    assert "empty" in error(server, "/v1/completions/render", {"prompt": []})["message"]
    assert error(server, "/v1/completions/render", {"prompt": ""})["param"] == "prompt"
    schema = {"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}
    schema["tools"][0]["function"]["parameters"] = {"type": "no-such-type"}
    assert error(server, "/v1/chat/completions/render", schema)["param"].startswith("tools.0")


def test_every_route_needs_the_key(server):
    for path in ROUTES:
        reply = post(server, path, {"prompt": "a"}, headers={})
        assert reply.status_code == 401, path
        assert reply.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/kv_event_sources", timeout=30).status_code == 401
    counts = http_counts(server.url, API_KEY)
    assert all(counts.get((path, "401"), 0) >= 1 for path in ROUTES)  # counted by name


def test_kv_event_sources_are_empty_without_events(server):
    reply = httpx.get(server.url + "/kv_event_sources", headers=AUTH, timeout=30)
    assert reply.status_code == 200 and reply.json() == {}
    info = httpx.get(server.url + "/get_server_info", headers=AUTH, timeout=30).json()
    assert info["kv_block_size"] == info["page_size"] == 16  # what discovery reads


def test_kv_event_sources_name_the_publisher():
    """vllm-router's discovery shape (src/kv_index/discovery.rs KvEventSourceEntry), per rank."""

    def sources(kv_events: str | None) -> dict:
        settings = parse_kv_events(kv_events)
        return settings.event_sources() if settings is not None else {}

    assert sources(None) == {} and sources('{"publisher": "null"}') == {}
    (rank,) = sources('{"endpoint": "tcp://*:5557", "topic": "kv"}').items()
    assert rank[0] == "0"
    assert rank[1] | {"hwm": None, "buffer_steps": None} == {
        "endpoint": "tcp://*:5557",
        "replay_endpoint": None,
        "topic": "kv",
        "hwm": None,
        "buffer_steps": None,
        "publisher": "zmq",
        "encoding": "msgpack",
        "schema_version": 1,
        "enable_kv_cache_events": True,
    }
