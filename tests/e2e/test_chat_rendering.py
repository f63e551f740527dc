"""How a chat request becomes a prompt, and how its output will be read (no server needed)."""

from __future__ import annotations

import json

import pytest

from engine.server.auth import cache_salt, key_salt
from engine.server.chat_rendering import render_chat
from engine.server.error_responses import APIError
from engine.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.e2e.fixtures import SEARCH_TOOL, WEATHER_TOOL, hermes_tokenizer, served
from tests.engine.checkpoints import CHATML_TEMPLATE, save_tokenizer

USER = [{"role": "user", "content": "Weather in Paris?"}]


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": USER, **fields})


@pytest.fixture(scope="module")
def chatml_model(tmp_path_factory):
    """A plain ChatML template, like the default model's: it ignores `tools`."""
    tokenizer = save_tokenizer(tmp_path_factory.mktemp("chatml"), vocab_size=320)
    return served(tokenizer, template=CHATML_TEMPLATE, model_type="llama")


@pytest.fixture(scope="module")
def hermes_model(tmp_path_factory):
    return served(hermes_tokenizer(tmp_path_factory.mktemp("hermes")))


def test_template_without_tools_gets_them_in_the_system_message(chatml_model):
    history = USER + [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    prompt = render_chat(request(messages=history, tools=[WEATHER_TOOL]), chatml_model)
    assert prompt.text.startswith("<|im_start|>system\n# Tools")
    assert json.dumps(WEATHER_TOOL) in prompt.text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt.text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>" in prompt.text
    assert prompt.tool_parser == "hermes"
    # `<tool_call>` is plain text for this tokenizer, so special tokens stay skipped.
    assert prompt.skip_special_tokens is True and prompt.strip_texts == ()
    assert prompt.token_ids == chatml_model.tokenizer.encode(prompt.text, add_special_tokens=False)


def test_no_tools_means_no_parser_and_an_untouched_prompt(chatml_model):
    prompt = render_chat(request(), chatml_model)
    assert prompt.text == "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    assert prompt.tool_parser is None and prompt.reasoning is False
    none = render_chat(request(tools=[WEATHER_TOOL], tool_choice="none"), chatml_model)
    assert none.text == prompt.text and none.tool_parser is None


def test_template_with_tools_renders_them_and_keeps_special_markers(hermes_model):
    prompt = render_chat(request(tools=[WEATHER_TOOL, SEARCH_TOOL]), hermes_model)
    assert "<tools>" in prompt.text and "web.search-v2" in prompt.text
    assert prompt.tool_parser == "hermes"
    assert prompt.skip_special_tokens is False
    assert "<|im_end|>" in prompt.strip_texts and "<tool_call>" not in prompt.strip_texts
    assert prompt.clean("a<|im_start|>b<tool_call>") == "ab<tool_call>"
    # The client may still ask for special tokens to be skipped.
    skipped = render_chat(request(tools=[WEATHER_TOOL], skip_special_tokens=True), hermes_model)
    assert skipped.skip_special_tokens is True and skipped.strip_texts == ()


def test_parser_follows_model_type(hermes_model):
    kimi = served(
        hermes_model.tokenizer,
        template=hermes_model.chat_template + "{# <|tool_call_begin|> #}",
        model_type="kimi_k2",
    )
    assert render_chat(request(tools=[WEATHER_TOOL]), kimi).tool_parser == "kimi_k2"


def test_named_and_required_tool_choice_checks(hermes_model):
    named = {"type": "function", "function": {"name": "get_weather"}}
    prompt = render_chat(
        request(tools=[WEATHER_TOOL, SEARCH_TOOL], tool_choice=named), hermes_model
    )
    assert [tool["function"]["name"] for tool in prompt.tools] == ["get_weather"]
    with pytest.raises(APIError, match="not among the tools"):
        missing = {"type": "function", "function": {"name": "nope"}}
        render_chat(request(tools=[WEATHER_TOOL], tool_choice=missing), hermes_model)
    with pytest.raises(APIError, match="no tools"):
        render_chat(request(tool_choice="required"), hermes_model)


def test_content_parts_and_developer_role(chatml_model):
    messages = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "!"}],
        },
    ]
    prompt = render_chat(request(messages=messages), chatml_model)
    assert "<|im_start|>system\nBe brief.<|im_end|>" in prompt.text
    assert "<|im_start|>user\nHi !<|im_end|>" in prompt.text


def test_continue_final_message(chatml_model):
    messages = USER + [{"role": "assistant", "content": "It is"}]
    prompt = render_chat(request(messages=messages, continue_final_message=True), chatml_model)
    assert prompt.text.endswith("<|im_start|>assistant\nIt is")


def test_completion_prompt_forms():
    def prompts(value):
        return CompletionRequest.model_validate({"prompt": value}).prompts()

    assert prompts("hi") == ["hi"]
    assert prompts([1, 2, 3]) == [[1, 2, 3]]
    assert prompts(["a", "b"]) == ["a", "b"]
    assert prompts([[1], [2, 3]]) == [[1], [2, 3]]


def test_cache_salts():
    assert cache_salt(None, None) == ""
    assert cache_salt(None, "t") == "salt:t"
    assert key_salt("k") != key_salt("k2") and "secret-key" not in key_salt("secret-key")
    assert cache_salt("k", None) == key_salt("k")
    assert cache_salt("k", "t") != cache_salt("k2", "t") != cache_salt("k", None)
