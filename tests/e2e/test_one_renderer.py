"""One chat renderer: the server, the agent's LocalClient and LLM.chat send the same prompt
bytes and read the answer with the same parser, for several models' real templates.

Each caller runs its own code path down to the engine: the server over HTTP
(the openai client), the LocalClient through `stream`, `LLM.chat` through
`generate`. The server and the client talk to a recording scripted engine
loaded with the model's tokenizer; LLM.chat runs the real tiny engine, with
its `add_request` recorded.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.core.clients import ChatRequest, ToolCall
from agent.core.clients.local import LocalClient
from engine import LLM, SamplingParams
from engine.devtools.testing.checkpoints import make_checkpoint
from engine.model_files.store import default_model_dir
from engine.server.app import create_app
from engine.server.background import BackgroundServer
from engine.server.chat_rendering import render_chat
from engine.server.protocol import ChatCompletionRequest
from engine.server.served_model import ServedModel
from tests.e2e.conftest import client_for
from tests.e2e.fixtures import SEARCH_TOOL, WEATHER_TOOL, default_model_present
from tests.e2e.scripted_engine import Script, ScriptedEngine

# Family -> the parser its template and model_type call for when tools are offered.
MODELS = {
    "llama": "hermes",  # plain ChatML, like the default model: tools as text
    "kimi_k2": "kimi_k2",
    "kimi_k25": "kimi_k2",
    "glm4_moe": "glm45",
    "default": "hermes",  # SmolLM2-135M-Instruct, when pulled
}
# One call to get_weather(city="Paris"), as each format writes it.
NATIVE_CALLS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "</tool_call>",
}
SYSTEM = {"role": "system", "content": "You are a careful assistant."}
ASK = {"role": "user", "content": "Weather in Paris? Then search for umbrellas."}
CALLED = {
    "role": "assistant",
    "content": "",
    # Reasoning after the last user turn: thinking templates render it inside <think>.
    "reasoning_content": "The user wants the weather first.",
    "tool_calls": [
        {
            "id": "functions.get_weather:0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny, 21 C"}
CONVERSATIONS = {
    "plain": ([SYSTEM, ASK], []),
    "tools": ([SYSTEM, ASK], [WEATHER_TOOL, SEARCH_TOOL]),
    "tool_history_with_reasoning": ([SYSTEM, ASK, CALLED, RESULT], [WEATHER_TOOL, SEARCH_TOOL]),
}


class Callers:
    """The three callers over one model."""

    def __init__(self, model_dir: Path, **engine_options) -> None:
        self.llm = LLM(str(model_dir), max_model_len=4096, **engine_options)
        engine = self.llm.engine
        self.scripted = ScriptedEngine()
        # Enough of the AsyncEngine surface for the LocalClient: the real tokenizer and folder.
        self.scripted.tokenizer = engine.tokenizer
        self.scripted.engine = SimpleNamespace(model_dir=engine.model_dir)
        self.scripted.stats = self._stats
        self.served = ServedModel.from_engine(SimpleNamespace(engine=engine), "under-test")
        self.server = BackgroundServer(create_app(self.scripted, self.served))
        self.local = LocalClient(self.scripted, "under-test")

    @staticmethod
    async def _stats() -> dict:
        return {"max_context_tokens": 100_000, "capacity_tokens": 100_000}

    def via_server(self, messages, tools) -> tuple[list[int], bool]:
        extra = {"tools": tools} if tools else {}
        client = client_for(self.server, api_key=None)
        client.chat.completions.create(model="under-test", messages=messages, max_tokens=4, **extra)
        sent = self.scripted.submitted[-1]
        return sent.prompt, sent.params.skip_special_tokens

    def via_local_client(self, messages, tools) -> tuple[list[int], bool]:
        async def run():
            return [item async for item in self.local.stream(ChatRequest(messages, tools))]

        asyncio.run(run())
        sent = self.scripted.submitted[-1]
        return sent.prompt, sent.params.skip_special_tokens

    def via_llm_chat(self, messages, tools) -> tuple[list[int], bool]:
        engine = self.llm.engine
        add_request = engine.add_request
        sent = []
        engine.add_request = lambda prompt, params, **kw: (
            sent.append((list(prompt), params.skip_special_tokens))
            or add_request(prompt, params, **kw)
        )
        try:
            params = SamplingParams(max_tokens=2, temperature=0)
            result = self.llm.chat(messages, params, tools=tools)
        finally:
            del engine.add_request
        # The reply comes back read by the parser the rendering chose.
        expected = self.llm.render_chat(messages, tools).parse(result.outputs[0].text)
        assert result.message == expected
        (only,) = sent
        return only

    def rendered(self, messages, tools):
        """Each caller's own rendering of the chat (what it sends, how it reads the answer)."""
        body = {"model": "under-test", "messages": messages, **({"tools": tools} if tools else {})}
        server = render_chat(
            ChatCompletionRequest.model_validate(json.loads(json.dumps(body))), self.served
        )
        return {
            "server": server,
            "local_client": self.local.renderer.render(messages, tools),
            "llm_chat": self.llm.render_chat(messages, tools),
        }


@pytest.fixture(scope="module", params=sorted(MODELS))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def callers(family, tmp_path_factory):
    if family == "default":
        if not default_model_present():
            pytest.skip("the default model is not pulled (run `resident models pull`)")
        callers = Callers(default_model_dir(), kv_memory=0.25)
    else:
        # Room for the tool declarations in every template (the tiny defaults allow 512).
        folder = tmp_path_factory.mktemp(family) / family
        model_dir = make_checkpoint(family, folder, max_position_embeddings=4096).path
        callers = Callers(model_dir, dtype="float32", kv_cache_dtype="auto", kv_memory=0.05)
    with callers.server:
        yield callers


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_every_caller_sends_the_same_prompt(callers, conversation):
    messages, tools = CONVERSATIONS[conversation]
    server = callers.via_server(messages, tools)
    local = callers.via_local_client(messages, tools)
    llm = callers.via_llm_chat(messages, tools)
    assert server == local == llm
    rendered = callers.rendered(messages, tools)
    texts = {caller: prompt.text.encode() for caller, prompt in rendered.items()}
    assert len(set(texts.values())) == 1, texts
    assert rendered["server"].token_ids == server[0]
    if conversation == "tool_history_with_reasoning" and rendered["server"].reasoning:
        assert "The user wants the weather first." in rendered["server"].text


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_every_caller_chooses_the_same_parser(callers, family, conversation):
    messages, tools = CONVERSATIONS[conversation]
    rendered = callers.rendered(messages, tools)
    expected = MODELS[family] if tools else None
    for caller, prompt in rendered.items():
        assert prompt.tool_parser == expected, caller
        assert prompt.reasoning == rendered["server"].reasoning, caller
        assert prompt.starts_in_reasoning == rendered["server"].starts_in_reasoning, caller
        assert prompt.strip_texts == rendered["server"].strip_texts, caller


def test_every_caller_reads_a_native_call_the_same_way(callers, family):
    messages, tools = CONVERSATIONS["tools"]
    answer = NATIVE_CALLS[MODELS[family]]
    pieces = [answer[i : i + 5] for i in range(0, len(answer), 5)]

    callers.scripted.push(Script(pieces))
    reply = client_for(callers.server, api_key=None).chat.completions.create(
        model="under-test", messages=messages, tools=tools, max_tokens=64
    )
    (server_call,) = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls"

    callers.scripted.push(Script(pieces))

    async def run():
        return [item async for item in callers.local.stream(ChatRequest(messages, tools))]

    (local_call,) = [item for item in asyncio.run(run()) if isinstance(item, ToolCall)]

    (llm_call,) = callers.llm.render_chat(messages, tools).parse(answer).tool_calls

    calls = [
        (server_call.function.name, json.loads(server_call.function.arguments)),
        (local_call.name, json.loads(local_call.arguments_json)),
        (llm_call.name, json.loads(llm_call.arguments_json)),
    ]
    assert calls == [("get_weather", {"city": "Paris"})] * 3
