"""The engine's one chat renderer (engine.rendering): its rules, on real tokenizers and templates.

That the server, the LocalClient and LLM.chat all go through it is tested in
tests/e2e/test_one_renderer.py; here, what it does with messages, tools and options.
"""

from __future__ import annotations

import json

import pytest

from engine.chat.reasoning import THINK_CLOSE
from engine.devtools.testing.chat_templates import CHATML_TEMPLATE
from engine.devtools.testing.tokenizers import (
    save_bpe_tokenizer,
    save_glm_tokenizer,
    save_kimi_tokenizer,
)
from engine.rendering import ChatRenderer, ChatRenderError, NoChatTemplateError
from engine.rendering.text_tools import INSTRUCTIONS

READ = {
    "type": "function",
    "function": {
        "name": "read",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}
ASK = [{"role": "user", "content": "read a.py"}]


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    return save_bpe_tokenizer(tmp_path_factory.mktemp("chatml"), 320)


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    return save_glm_tokenizer(tmp_path_factory.mktemp("glm"))


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    return save_kimi_tokenizer(tmp_path_factory.mktemp("kimi"))


def test_text_tools_for_a_template_without_tools(chatml):
    prompt = ChatRenderer(chatml, "llama").render(ASK, [READ])
    system = prompt.text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n# Tools")
    assert json.dumps(READ) in system
    # The line the server's copy of these instructions used to lack.
    assert system.endswith(
        "The result of each call comes back between <tool_response> and </tool_response>."
    )
    assert prompt.tool_parser == "hermes" and prompt.reasoning is False
    assert prompt.token_ids == chatml.encode(prompt.text, add_special_tokens=False)
    assert INSTRUCTIONS.splitlines()[0] == "# Tools"


def test_a_template_naming_tools_in_a_format_no_parser_reads_gets_text_tools(chatml):
    # Mentions `tools` but writes no markers any parser knows, for an unknown model_type.
    template = "{# tools are ignored #}" + CHATML_TEMPLATE
    renderer = ChatRenderer(chatml, "mystery", template)
    prompt = renderer.render(ASK, [READ])
    assert renderer.native_parser is None
    assert prompt.tool_parser == "hermes" and "# Tools" in prompt.text


def test_native_tools_keep_the_markers_the_parser_needs(kimi):
    prompt = ChatRenderer(kimi, "kimi_k2").render(ASK, [READ])
    assert prompt.text.startswith("<|im_system|>tool_declare<|im_middle|>[{")
    assert "# Tools" not in prompt.text
    assert prompt.tool_parser == "kimi_k2" and prompt.reasoning is True
    assert prompt.skip_special_tokens is False
    assert "<|im_end|>" in prompt.strip_texts and "<|tool_call_begin|>" not in prompt.strip_texts
    # A request may still ask for special tokens to be skipped.
    skipped = ChatRenderer(kimi, "kimi_k2").render(ASK, [READ], skip_special_tokens=True)
    assert skipped.skip_special_tokens is True and skipped.strip_texts == ()


def test_no_tools_means_no_parser(kimi, chatml):
    assert ChatRenderer(kimi, "kimi_k2").render(ASK).tool_parser is None
    plain = ChatRenderer(chatml, "llama").render(ASK, [])
    assert plain.text == "<|im_start|>user\nread a.py<|im_end|>\n<|im_start|>assistant\n"


def test_tools_reduce_to_what_a_template_renders(chatml):
    extra = {
        "type": "function",
        "strict": True,
        "function": {**READ["function"], "strict": True, "description": None},
    }
    renderer = ChatRenderer(chatml, "llama")
    prompt = renderer.render(ASK, [extra])
    expected = {
        "type": "function",
        "function": {"name": "read", "parameters": READ["function"]["parameters"]},
    }
    assert json.dumps(expected) in prompt.text and "strict" not in prompt.text
    assert prompt.tools == [expected]
    with pytest.raises(ChatRenderError, match="function with a name") as caught:
        renderer.render(ASK, [{"type": "function"}])
    assert caught.value.param == "tools.0"


def test_messages_normalize_the_same_whatever_the_caller_left_out(kimi):
    renderer = ChatRenderer(kimi, "kimi_k2")
    call = {"id": "functions.read:0", "type": "function", "function": {"name": "read"}}
    sparse = [
        {
            "role": "developer",
            "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        },
        *ASK,
        {
            "role": "assistant",
            "tool_calls": [{**call, "function": {"name": "read", "arguments": '{"path": "a.py"}'}}],
        },
        {"role": "tool", "tool_call_id": "functions.read:0", "content": "x = 1"},
    ]
    full = [
        {"role": "system", "content": "Be brief.", "name": None},
        {**ASK[0], "tool_calls": None},
        {"role": "assistant", "content": None, "tool_calls": [{**call, "function": {"name": "read", "arguments": {"path": "a.py"}}}]},
        {"role": "tool", "tool_call_id": "functions.read:0", "content": "x = 1"},
    ]  # fmt: skip
    assert renderer.render(sparse, [READ]).text == renderer.render(full, [READ]).text
    assert '{"path": "a.py"}' in renderer.render(sparse, [READ]).text
    with pytest.raises(ChatRenderError, match="image_url") as caught:
        renderer.render([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    assert caught.value.param == "messages.0.content"
    with pytest.raises(ChatRenderError, match="role"):
        renderer.render([{"content": "no role"}])


def test_template_options_reach_the_template_but_cannot_override_the_call(glm):
    renderer = ChatRenderer(glm, "glm4_moe")
    assert renderer.render(ASK).text.endswith("<|user|>\nread a.py<|assistant|>")
    no_think = renderer.render(ASK, template_kwargs={"enable_thinking": False})
    assert no_think.text.endswith("read a.py/nothink<|assistant|>\n<think></think>")
    ignored = renderer.render(
        ASK, template_kwargs={"add_generation_prompt": False, "tools": [READ]}
    )
    assert ignored.text == renderer.render(ASK).text


def test_continue_final_message_and_prefixes(chatml):
    renderer = ChatRenderer(chatml, "llama")
    messages = [*ASK, {"role": "assistant", "content": "It says"}]
    assert renderer.render(messages, continue_final_message=True).text.endswith(
        "<|im_start|>assistant\nIt says"
    )
    prefix = renderer.render_text(ASK, add_generation_prompt=False)
    assert renderer.render(ASK).text.startswith(prefix) and not prefix.endswith("assistant\n")


def test_a_prompt_that_opens_think_starts_the_answer_in_reasoning(chatml):
    # A thinking model's habit: the generation prompt opens <think> for the model.
    opened = "<|im_start|>assistant\n<think>\n{% endif %}"
    template = CHATML_TEMPLATE.replace("<|im_start|>assistant\n{% endif %}", opened)
    template += "{# reasoning ends at " + THINK_CLOSE + " #}"
    prompt = ChatRenderer(chatml, "llama", template).render(ASK)
    assert prompt.text.endswith("<think>\n")
    assert prompt.reasoning and prompt.starts_in_reasoning
    parsed = prompt.parse("the file is short</think>It sets x.")
    assert (parsed.reasoning_content, parsed.content) == ("the file is short", "It sets x.")


def test_missing_and_failing_templates_are_render_errors(chatml, tmp_path):
    bare = save_bpe_tokenizer(tmp_path / "bare", 320)
    bare.chat_template = None
    with pytest.raises(NoChatTemplateError):
        ChatRenderer(bare, "llama")
    failing = ChatRenderer(chatml, "llama", "{{ raise_exception('no system messages') }}")
    with pytest.raises(ChatRenderError, match="no system messages"):
        failing.render(ASK)
