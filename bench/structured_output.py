"""Constrained decoding: malformed tool calls with and without it, and what it costs; prints JSON.

(a) Malformed calls. 50 scripted coding tasks, each rendered with the
agent's five core tools (read, grep, shell, edit, list: their real schemas)
through the engine's chat renderer, answered by the default model greedily
and sampled (temperature 1.0, seed = task index), in three situations:

- `unforced`: the model decides whether to call. Without constraint (the
  agent before) and with the agent's constraint (agent/core/clients/structured.py:
  free text, but a call the model opens must be completed validly).
- `opened`: the assistant turn already begins `<tool_call>` (the prompt ends
  with it): how often a call the model has started comes out malformed,
  without constraint and with the agent's (told the answer began so).
- `required`: `tool_choice: "required"` without constraint (what the server
  did before: tools rendered, nothing enforced) and with it, one call
  (`parallel_tool_calls: false`) and any number.

An answer is a valid call when it holds at least one call, every call parses
and its arguments validate against the tool's schema (engine.chat.json_schema),
and nothing malformed is left over. Anything else is malformed: `no_call`
(prose), `cut_off` (the token budget ran out inside a call), `unparsable`
(markup the parser rejected) or `schema_invalid`.

(b) Overhead in a batch of 16: decode tokens/s with 16 unconstrained requests,
16 constrained, and 1 constrained among 15 unconstrained, all generating the
same number of tokens (unconstrained with ignore_eos; constrained under a
schema that cannot end sooner), best of `--repeats` interleaved runs; and the
mask step alone (sync, fill, apply on a [16, vocab] logits tensor), timed
without the model, which a busy machine disturbs far less.

    .venv/bin/python bench/structured_output.py [--repeats 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from agent.core.clients.structured import tool_call_constraint
from engine import LLM, SamplingParams
from engine.chat.json_schema import schema_errors
from engine.grammar import StructuredOutput
from engine.grammar import masks as grammar_masks
from engine.grammar.backend import GrammarBackend, backend_for
from engine.rendering import ChatRenderer
from tools.files.edit import EditTool
from tools.files.grep import GrepTool
from tools.files.read import ReadTool
from tools.files.search import ListTool
from tools.shell.tool import ShellTool

MODEL = "smollm2-135m-instruct"
SYSTEM = (
    "You are a coding agent working in a Python repository. Act with the tools: "
    "call one whenever the task needs to look at or change the repository."
)
OPENED = "<tool_call>\n"
TASKS = [
    "Show me the contents of README.md.",
    "Read setup.py and tell me the package name.",
    "Open src/app/main.py, lines 40 to 80.",
    "What does the file docs/index.md say?",
    "Read the first 20 lines of CHANGELOG.md.",
    "Print pyproject.toml.",
    "Look at tests/test_api.py.",
    "Read the Makefile.",
    "Show the .gitignore file.",
    "Open src/app/config.py from line 100.",
    "Find every TODO comment in the code.",
    "Search for the function parse_args.",
    "Where is the class UserSession defined?",
    "Find all imports of requests in Python files.",
    "Search the tests directory for 'assert False'.",
    "Which files mention DATABASE_URL?",
    "Find the string 'deprecated', ignoring case.",
    "List the files that call os.system.",
    "Search for 'def main' in *.py files.",
    "Grep for FIXME in src.",
    "Run the test suite with pytest.",
    "Show the git log of the last five commits.",
    "Count the lines of Python code in src.",
    "Install the package in editable mode.",
    "Run flake8 on the src directory.",
    "Check which Python version is installed.",
    "Build the documentation with make docs.",
    "Show disk usage of the repository.",
    "Run the script scripts/migrate.py.",
    "Print the current git branch.",
    "In src/app/config.py, replace DEBUG = True with DEBUG = False.",
    "Rename the function fetch_data to load_data in src/app/io.py.",
    "Change the version in pyproject.toml from 1.2.0 to 1.3.0.",
    "In README.md, replace 'Python 3.8' with 'Python 3.10'.",
    "Fix the typo 'recieve' to 'receive' in src/app/net.py.",
    "In tests/test_api.py, change timeout=5 to timeout=30.",
    "Replace print( with logger.info( in src/app/main.py, everywhere.",
    "In Makefile, change the python3.9 to python3.11.",
    "Set MAX_RETRIES = 3 instead of MAX_RETRIES = 5 in src/app/net.py.",
    "Update the copyright year 2023 to 2024 in LICENSE.",
    "List the files in the repository.",
    "What is in the src directory?",
    "Show the tests folder, three levels deep.",
    "List the docs directory.",
    "Show me the project layout.",
    "What files are in scripts/?",
    "List the top level of the repository only.",
    "Give me an overview of the src/app package's files.",
    "List everything under examples.",
    "Show the structure of the tests directory.",
]
TOOL_CLASSES = (ReadTool, GrepTool, ShellTool, EditTool, ListTool)
# A schema no answer can end before it is `--tokens` long: constrained and
# unconstrained requests then generate the same number of tokens.
ENDLESS = {
    "type": "object",
    "properties": {
        "lines": {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 4096}
    },
    "required": ["lines"],
    "additionalProperties": False,
}
KINDS = ("valid", "no_call", "cut_off", "unparsable", "schema_invalid")


def tool_schemas() -> list[dict]:
    # The schema is a property of the tool class; no workspace is needed to read it.
    return [cls.__new__(cls).schema() for cls in TOOL_CLASSES]


def classify(chat, text: str, schemas: dict[str, dict]) -> str:
    parsed = chat.parse(text)
    if parsed.errors:
        return "unparsable"
    if not parsed.tool_calls:
        return "no_call"
    for call in parsed.tool_calls:
        if call.name not in schemas:
            return "schema_invalid"
        try:
            arguments = json.loads(call.arguments_json)
        except ValueError:
            return "unparsable"
        if schema_errors(arguments, schemas[call.name]):
            return "schema_invalid"
    return "valid"


def _run(llm, chats, prompts, spec, temperature, max_tokens, schemas, prefix=""):
    params = [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            seed=index,
            structured=spec,
            skip_special_tokens=chat.skip_special_tokens,
        )
        for index, chat in enumerate(chats)
    ]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    counts = dict.fromkeys(KINDS, 0)
    for chat, output in zip(chats, outputs, strict=True):
        kind = classify(chat, prefix + output.outputs[0].text, schemas)
        if kind == "unparsable" and output.outputs[0].finish_reason == "length":
            kind = "cut_off"  # the budget ran out inside a call
        counts[kind] += 1
    return {
        **counts,
        "malformed_rate": round(1 - counts["valid"] / len(chats), 3),
        "malformed_complete_calls": counts["unparsable"] + counts["schema_invalid"],
        "truncated": sum(o.outputs[0].finish_reason == "length" for o in outputs),
        "seconds": round(seconds, 1),
    }


def malformed_calls(llm: LLM, max_tokens: int) -> dict:
    tools = tool_schemas()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    renderer = ChatRenderer.for_model_dir(llm.tokenizer, llm.engine.model_dir)
    chats = [
        renderer.render(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}], tools
        )
        for task in TASKS
    ]
    agent = tool_call_constraint(chats[0])
    parser = chats[0].tool_parser
    plain = [chat.token_ids for chat in chats]
    opened = [renderer.encode(chat.text + OPENED) for chat in chats]
    situations = {
        "unforced/free": (plain, None, ""),
        "unforced/agent": (plain, agent, ""),
        "opened/free": (opened, None, OPENED),
        "opened/agent": (
            opened,
            StructuredOutput(tool_calls=agent.tool_calls, prefix=OPENED),
            OPENED,
        ),
        "required/one_call": (
            plain,
            StructuredOutput.for_tool_calls(parser, tools, required=True, parallel=False),
            "",
        ),
        "required/any_calls": (
            plain,
            StructuredOutput.for_tool_calls(parser, tools, required=True),
            "",
        ),
    }
    results = {}
    for name, (prompts, spec, prefix) in situations.items():
        for temperature in (0.0, 1.0):
            results[f"{name}@t={temperature:g}"] = _run(
                llm, chats, prompts, spec, temperature, max_tokens, schemas, prefix
            )
    return {
        "tool_parser": parser,
        "prompts": len(TASKS),
        "max_tokens": max_tokens,
        # `tool_choice: required` without constraint rendered and sampled exactly as unforced/free.
        "required_without_constraint": "= unforced/free",
        "runs": results,
    }


def _params(constrained: bool, spec: StructuredOutput, tokens: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=tokens,
        temperature=0.0,
        ignore_eos=True,
        structured=spec if constrained else None,
    )


def end_to_end(llm: LLM, tokens: int, repeats: int) -> dict:
    renderer = ChatRenderer.for_model_dir(llm.tokenizer, llm.engine.model_dir)
    prompts = [
        renderer.render([{"role": "user", "content": f"{task} Answer as JSON."}]).token_ids
        for task in TASKS[:16]
    ]
    spec = StructuredOutput.for_json_schema(ENDLESS)
    layouts = {
        "unconstrained_16": [False] * 16,
        "constrained_16": [True] * 16,
        "constrained_1_of_16": [True] + [False] * 15,
    }
    llm.generate(prompts, [_params(c, spec, tokens) for c in layouts["constrained_16"]])  # warm
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, layout in layouts.items():
            start = time.perf_counter()
            outputs = llm.generate(prompts, [_params(c, spec, tokens) for c in layout])
            seconds = time.perf_counter() - start
            assert sum(len(o.outputs[0].token_ids) for o in outputs) == 16 * tokens, name
            best[name] = min(best.get(name, float("inf")), seconds)
    plain = best["unconstrained_16"]
    return {
        name: {
            "tokens_per_s": round(16 * tokens / seconds, 1),
            "relative_to_unconstrained": round(plain / seconds, 3),
        }
        for name, seconds in best.items()
    }


class _Seq:
    def __init__(self, grammar, output_token_ids):
        self.grammar = grammar
        self.output_token_ids = output_token_ids
        self.params = SamplingParams()


def compile_times(llm: LLM) -> dict:
    """First-use costs, on a fresh backend: the vocabulary walk, then each grammar's compile."""
    engine = llm.engine
    start = time.perf_counter()
    backend = GrammarBackend(engine.tokenizer, engine.model_config.vocab_size, engine.eos_token_ids)
    report = {"tokenizer_info_ms": round(1e3 * (time.perf_counter() - start), 1)}
    tools = tool_schemas()
    specs = {
        "agent_5_tools": StructuredOutput.for_tool_calls("hermes", tools, required=False),
        "required_5_tools": StructuredOutput.for_tool_calls("hermes", tools, required=True),
        "json_schema_endless": StructuredOutput.for_json_schema(ENDLESS),
        "json_object": StructuredOutput.for_json_object(),
    }
    for name, spec in specs.items():
        start = time.perf_counter()
        backend.compile(spec)
        report[f"{name}_ms"] = round(1e3 * (time.perf_counter() - start), 1)
    return report


def mask_step(llm: LLM, repeats: int = 200) -> dict:
    """The mask step alone: 1 or 16 constrained rows in a [16, vocab] batch, matchers
    inside a JSON string (where most tokens are allowed) and between values."""
    engine = llm.engine
    backend = backend_for(engine.tokenizer, engine.model_config.vocab_size, engine.eos_token_ids)
    spec = StructuredOutput.for_json_schema(ENDLESS)
    states = {
        "in_string": '{"lines": ["the quick brown',
        "between_values": '{"lines": ["a", "b"',
    }
    vocab = engine.model_config.vocab_size
    logits = torch.randn(16, vocab)
    report = {}
    for state, text in states.items():
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
        for rows in (1, 16):
            seqs = [
                _Seq(backend.request_grammar(spec) if i < rows else None, list(ids))
                for i in range(16)
            ]
            times = []
            for _ in range(repeats):
                work = logits.clone()
                start = time.perf_counter()
                grammar_masks.apply_grammar_masks(work, seqs)
                times.append(time.perf_counter() - start)
            median = statistics.median(times)
            report[f"{state}/{rows}_of_16"] = {
                "ms_per_step": round(1e3 * median, 3),
                "us_per_constrained_row": round(1e6 * median / rows, 1),
            }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64, help="decode tokens per request in (b)")
    parser.add_argument("--max-tokens", type=int, default=160, help="answer budget in (a)")
    parser.add_argument("--skip-calls", action="store_true", help="only (b)")
    args = parser.parse_args()
    llm = LLM(args.model)
    report = {
        "model": args.model,
        "kv_cache_dtype": llm.engine.kv_dtype,
        "device": str(llm.engine.device),
        "attention_backend": llm.engine.runner.backend.name,
        "threads": torch.get_num_threads(),
        "first_use": compile_times(llm),  # first, while nothing is cached
    }
    if not args.skip_calls:
        report["malformed_calls"] = malformed_calls(llm, args.max_tokens)
    report["overhead"] = {
        "batch": 16,
        "tokens_per_request": args.tokens,
        "best_of": args.repeats,
        "end_to_end": end_to_end(llm, args.tokens, args.repeats),
        "mask_step": mask_step(llm),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
