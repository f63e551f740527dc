"""Constrained decoding on the default model (SmolLM2-135M-Instruct, FP8 KV cache).

Sampled at temperature 1.0 over 20 seeds, every answer under a JSON schema,
`tool_choice` required (one call) or a named function validates: the
schemas bound every string, so an answer always fits its token budget. Any
JSON object (12 seeds) has no such bound: an answer that ran out of tokens is
still the start of one. The unconstrained requests of a batch are untouched
by a constrained neighbour, and a request preempted for want of KV pages and
recomputed keeps a grammar state that matches its output.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from engine import LLM, SamplingParams
from engine.async_engine import AsyncEngine
from engine.chat.json_schema import schema_errors
from engine.grammar import StructuredOutput
from engine.grammar.backend import GrammarBackend, backend_for
from engine.model_files.store import default_model_dir, is_complete
from engine.rendering import ChatRenderer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not is_complete(default_model_dir()),
        reason="default model not pulled: resident models pull",
    ),
]
MODEL = "smollm2-135m-instruct"
SEEDS = range(20)
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 24},
        "country": {"type": "string", "enum": ["France", "Japan", "Peru", "Kenya"]},
        "celsius": {"type": "integer", "minimum": -60, "maximum": 60},
        "sunny": {"type": "boolean"},
    },
    "required": ["city", "country", "celsius"],
    "additionalProperties": False,
}
# Argument strings bounded by their patterns: a grammar cannot bound a string's
# length and keep the format's closing marker out of it at once
# (engine/grammar/tool_calls.py), and a pattern does both.
PATH = "^[A-Za-z0-9_./-]{1,40}$"
COMMAND = "^[A-Za-z0-9 _./|=-]{1,48}$"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file of the repository.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "pattern": PATH},
                    "offset": {"type": "integer", "minimum": 1, "maximum": 100000},
                },
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "pattern": COMMAND}},
                "required": ["command"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL)


@pytest.fixture(scope="module")
def renderer(llm):
    return ChatRenderer.for_model_dir(llm.tokenizer, llm.engine.model_dir)


def sampled(spec: StructuredOutput, max_tokens: int, seeds=SEEDS, **kwargs) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, structured=spec, **kwargs)
        for seed in seeds
    ]


def test_json_answers_validate_over_seeds(llm, renderer):
    assert llm.engine.kv_dtype == "fp8_e4m3"
    prompt = renderer.render(
        [{"role": "user", "content": "The weather in a city of your choice, as JSON."}]
    ).token_ids
    schema, any_object = StructuredOutput.for_json_schema(CITY), StructuredOutput.for_json_object()
    # Fewer seeds for the object: nothing bounds it, and the batch runs as long as its longest.
    params = sampled(schema, 128) + sampled(any_object, 96, seeds=range(12))
    outputs = [o.outputs[0] for o in llm.generate([prompt] * len(params), params)]
    for output in outputs[: len(SEEDS)]:
        assert output.finish_reason == "stop", output.text
        assert schema_errors(json.loads(output.text), CITY) == [], output.text
    # Any JSON object has no bound on its length: a rambling one may run out of
    # tokens. What was written is then still the start of one (the grammar says so).
    objects = outputs[len(SEEDS) :]
    grammar = backend_for(
        llm.tokenizer, llm.engine.model_config.vocab_size, llm.engine.eos_token_ids
    )
    for output in objects:
        if output.finish_reason == "stop":
            assert isinstance(json.loads(output.text), dict), output.text
        else:
            state = grammar.request_grammar(any_object)
            state.sync(output.token_ids)
            assert output.finish_reason == "length" and state.error is None
    assert sum(o.finish_reason == "stop" for o in objects) >= len(objects) // 2


def calls_of(chat, text: str) -> list[tuple[str, dict]]:
    parsed = chat.parse(text)
    assert not parsed.errors, text
    return [(call.name, json.loads(call.arguments_json)) for call in parsed.tool_calls]


def test_required_and_named_tool_calls_validate_over_seeds(llm, renderer):
    chat = renderer.render(
        [{"role": "user", "content": "Show me what is in the file setup.cfg."}], TOOLS
    )
    assert chat.tool_parser == "hermes"  # SmolLM2's template has no tools: the text format
    one_call = StructuredOutput.for_tool_calls("hermes", TOOLS, required=True, parallel=False)
    named = StructuredOutput.for_tool_calls("hermes", TOOLS[1:], required=True, parallel=False)
    keep = chat.skip_special_tokens
    params = sampled(one_call, 96, skip_special_tokens=keep) + sampled(
        named, 96, skip_special_tokens=keep
    )
    outputs = [o.outputs[0] for o in llm.generate([chat.token_ids] * len(params), params)]
    for index, output in enumerate(outputs):
        assert output.finish_reason == "stop", output.text
        calls = calls_of(chat, output.text)
        assert len(calls) == 1, output.text
        name, arguments = calls[0]
        if index >= len(SEEDS):
            assert name == "shell"
        assert schema_errors(arguments, SCHEMAS[name]) == [], output.text


def test_parallel_required_calls_are_each_valid(llm, renderer):
    """Allowed several calls, this model often writes calls until its budget runs
    out: every call it completed is valid, and only a cut-off last one is not."""
    chat = renderer.render([{"role": "user", "content": "Read README.md and run ls."}], TOOLS)
    spec = StructuredOutput.for_tool_calls("hermes", TOOLS, required=True)
    params = [
        SamplingParams(max_tokens=96, temperature=1.0, seed=s, structured=spec) for s in range(6)
    ]
    for output in (o.outputs[0] for o in llm.generate([chat.token_ids] * 6, params)):
        parsed = chat.parse(output.text)
        assert parsed.tool_calls, output.text
        for call in parsed.tool_calls:
            assert schema_errors(json.loads(call.arguments_json), SCHEMAS[call.name]) == []
        assert len(parsed.errors) <= (output.finish_reason == "length"), output.text


def test_a_constrained_neighbour_changes_nothing_for_the_others(renderer):
    """Greedy, batch-invariant engine: unconstrained requests batched with a
    constrained one give exactly the tokens they give alone."""
    llm = LLM(MODEL, deterministic=True)
    prompts = [
        renderer.render([{"role": "user", "content": text}]).token_ids
        for text in ("Name three rivers.", "What is a prime number?", "A city, as JSON.")
    ]
    plain = SamplingParams(max_tokens=16, temperature=0)
    alone = [llm.generate(p, plain)[0].outputs[0].token_ids for p in prompts[:2]]
    constrained = SamplingParams(
        max_tokens=16, temperature=0, structured=StructuredOutput.for_json_schema(CITY)
    )
    batch = llm.generate(prompts, [plain, plain, constrained])
    assert [o.outputs[0].token_ids for o in batch[:2]] == alone
    assert batch[2].outputs[0].text.startswith("{")


def test_a_preempted_request_keeps_its_grammar_and_ends_valid(renderer):
    """Four constrained requests in a KV cache of 192 tokens (11,520 bytes a token
    in FP8): each needs at least 36 prompt and 22 answer tokens, so they cannot
    all stay resident, whatever the backend writes; some are preempted and
    recomputed from their tokens."""
    llm = LLM(MODEL, kv_memory=192 * 11520 / 1024**3, max_model_len=192)
    assert llm.engine.capacity_tokens == 192
    words = {
        "type": "object",
        "properties": {
            "words": {
                "type": "array",
                "items": {"type": "string", "minLength": 3, "maxLength": 10},
                "minItems": 6,
                "maxItems": 6,
            }
        },
        "required": ["words"],
        "additionalProperties": False,
    }
    spec = StructuredOutput.for_json_schema(words)
    engine = llm.engine
    seqs = [
        engine.add_request(
            renderer.render([{"role": "user", "content": f"Six words about {topic}."}]).token_ids,
            SamplingParams(max_tokens=150, temperature=0, structured=spec),
        )
        for topic in ("rivers", "stars", "bread", "trains")
    ]
    while engine.has_unfinished():
        engine.step()
    assert sum(seq.num_preemptions for seq in seqs) > 0
    for seq in seqs:
        assert seq.finish_reason == "stop", seq.text
        assert seq.grammar.num_accepted == len(seq.output_token_ids)
        assert schema_errors(json.loads(seq.text), words) == [], seq.text


def test_the_server_compiles_grammars_off_the_engine_thread(llm, monkeypatch):
    """A new schema's compile must not stall the batch the engine thread is stepping."""
    compiled_on: list[str] = []
    compile_grammar = GrammarBackend.compile

    def recording(self, spec):
        compiled_on.append(threading.current_thread().name)
        return compile_grammar(self, spec)

    monkeypatch.setattr(GrammarBackend, "compile", recording)
    spec = StructuredOutput.for_json_schema({**CITY, "title": "off-thread"})
    params = SamplingParams(max_tokens=8, temperature=0.0, structured=spec)

    async def run() -> None:
        engine = AsyncEngine(engine=llm.engine)
        try:
            async for _ in engine.generate("Weather in Lima:", params, "off-thread"):
                pass
        finally:
            engine.shutdown()

    asyncio.run(run())
    assert compiled_on and "resident-engine" not in compiled_on[0]
