"""GLM-5.x (MLA with DeepSeek sparse attention) and Kimi Linear (KDA layers beside MLA) served
end to end: `resident serve` started as a user starts it (its defaults: FP8 KV calibrated
at start-up), the official openai client, and `resident run` attached to it or on its
own in-process engine.

The tiny checkpoints are the engine tests' (tests/engine/dsa_checkpoints.py,
kimi_linear_checkpoints.py) with a 4,096-token context, room for the agent's
system prompt. GLM-5's index_topk is 8, so every prompt here (a chat template
around even "Hi" is longer) attends sparsely; Kimi Linear's sequences each hold
a recurrent state slot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest

from tests.engine.agreement import assert_greedy_agrees
from tests.engine.distributed.helpers import (
    free_port,
    patience,
    resident_command,
    running,
    wait_healthy,
)
from tests.engine.dsa_checkpoints import INDEX_TOPK, build_glm_moe_dsa
from tests.engine.kimi_linear_checkpoints import build_kimi_linear

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = 4096
FAMILIES = {"glm_moe_dsa": build_glm_moe_dsa, "kimi_linear": build_kimi_linear}
# Requests alone and batched sum in another order, and with an FP8 cache a value that
# lands on the other side of a rounding boundary moves the logits by up to about 1e-2
# (the bound the tensor-parallel tests use for rounded caches); greedy tokens must
# agree wherever the alone run's top-2 margin exceeds twice that.
BATCH_LOGITS_TOL = 1e-2
QUESTIONS = ["Hi", "Name three colours.", "Explain recursion to a child in one sentence."]


@pytest.fixture(scope="module", params=list(FAMILIES))
def server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    model_dir = FAMILIES[request.param](root / "model", max_position_embeddings=CONTEXT)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = root / "serve.log"
    command = resident_command(
        "serve", "--model", str(model_dir), "--port", str(port), "--kv-memory", "0.01"
    )
    with running([*command, "--max-num-seqs", "4"], log) as process:
        wait_healthy(process, url, log)
        client = openai.OpenAI(
            base_url=url + "/v1", api_key="unused", max_retries=0, timeout=patience(12)
        )
        yield SimpleNamespace(url=url, model=str(model_dir), client=client, root=root)


def chat(server, content: str, max_tokens: int = 6, **extra):
    return server.client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
        **extra,
    )


def test_chat_streamed_and_whole_give_the_same_answer(server):
    whole = chat(server, QUESTIONS[2])
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 6
    assert whole.usage.prompt_tokens > INDEX_TOPK  # GLM-5 attends sparsely
    stream = chat(server, QUESTIONS[2], stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 6


def test_completions_answer_a_text_prompt(server):
    reply = server.client.completions.create(
        model=server.model,
        prompt="def fibonacci(n):",
        max_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5 and reply.usage.prompt_tokens > INDEX_TOPK
    assert reply.choices[0].text


def _tokens_and_margins(reply) -> tuple[list[bytes], list[float]]:
    """Each generated token (as its bytes: a chat reply carries no ids) and the top-2
    margin that chose it."""
    content = reply.choices[0].logprobs.content
    tokens = [bytes(item.bytes) for item in content]
    margins = [item.top_logprobs[0].logprob - item.top_logprobs[1].logprob for item in content]
    return tokens, margins


def test_concurrent_requests_answer_as_each_does_alone(server):
    def ask(question: str):
        return chat(server, question, max_tokens=16, logprobs=True, top_logprobs=2)

    alone = [ask(q) for q in QUESTIONS]

    def ask_together() -> tuple[list, bool]:
        start = threading.Barrier(len(QUESTIONS))
        spans = []

        def one(question: str):
            start.wait()  # sent at once, so the engine runs them in one batch
            began = time.monotonic()
            reply = ask(question)
            spans.append((began, time.monotonic()))
            return reply

        with ThreadPoolExecutor(len(QUESTIONS)) as pool:
            replies = list(pool.map(one, QUESTIONS))
        return replies, max(b for b, _ in spans) < min(e for _, e in spans)

    # On a loaded machine a thread may start only after another's request has ended;
    # such a round batched nothing, so it is asked again.
    for _ in range(5):
        together, overlapped = ask_together()
        if overlapped:
            break
    assert overlapped, "the three requests were never in flight at once"
    compared = 0
    for got, want in zip(together, alone, strict=True):
        want_tokens, margins = _tokens_and_margins(want)
        got_tokens, _ = _tokens_and_margins(got)
        compared += assert_greedy_agrees(got_tokens, want_tokens, margins, BATCH_LOGITS_TOL)
    assert compared >= len(QUESTIONS)  # not all close calls: the comparison decided something


def test_a_prompt_longer_than_the_context_is_a_clear_400(server):
    with pytest.raises(openai.BadRequestError) as caught:
        server.client.completions.create(
            model=server.model, prompt=[5] * (CONTEXT + 1), max_tokens=4
        )
    message = str(caught.value)
    assert f"{CONTEXT + 1} tokens" in message and f"{CONTEXT} tokens" in message
    assert httpx.get(server.url + "/health", timeout=patience(1)).status_code == 200


@pytest.mark.parametrize("engine", ["attached", "local"])
def test_the_headless_agent_completes_a_turn(server, engine):
    """`resident run --attach URL` through the server, and `resident run --model DIR` on
    an in-process engine: one turn, well-formed events, usage against the 4k context."""
    workspace = server.root / f"workspace-{engine}"
    workspace.mkdir()
    (workspace / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RESIDENT_NO_SANDBOX": "1",  # a read-only run; the sandbox is tested elsewhere
        "RESIDENT_API_KEY": "",
        **{
            f"RESIDENT_{kind}_DIR": str(server.root / kind.lower())
            for kind in ("DATA", "CONFIG", "CACHE")
        },
    }
    command = [sys.executable, "-m", "agent.cli", "run", "What does calc.py define?"]
    command += ["--attach", server.url] if engine == "attached" else ["--model", server.model]
    command += ["--json", "--tools", "read", "--approval", "read-only"]
    command += ["--max-tokens", "3", "--max-turns", "1"]
    run = subprocess.run(
        command,
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=patience(30),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    events = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    types = [event["type"] for event in events]
    assert "turn_completed" in types and types[-1] == "session_completed", types
    assert events[-1]["exit_code"] == 0
    usage = next(event for event in events if event["type"] == "usage")
    assert usage["context_window"] == CONTEXT
    assert usage["prompt_tokens"] > usage["resident_tokens"] > 0
    assert usage["completion_tokens"] == 3
