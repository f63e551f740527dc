"""A GGUF file served as a user serves it: `resident serve --model file.gguf`, whose CLI
starts making the packed weights' memory resident before it imports torch
(engine/host/early_pages.py), answers the official openai client with the greedy
tokens the library computes from the same file."""

from __future__ import annotations

import subprocess

import openai
import pytest

from engine.cpu_kernels.library import unavailable
from tests.engine.distributed.helpers import (
    free_port,
    patience,
    resident_command,
    running,
    wait_healthy,
)
from tests.engine.gguf_fixtures import write_tiny_block_gguf

pytestmark = pytest.mark.skipif(bool(unavailable()), reason=f"CPU kernels: {unavailable()}")
PROMPT = list(range(5, 40))
NEW = 8


def test_a_served_gguf_file_answers_what_the_library_computes(tmp_path):
    from engine import LLM, SamplingParams

    path = write_tiny_block_gguf(tmp_path / "model.gguf")
    params = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)
    llm = LLM(str(path), kv_cache_dtype="bf16", device="cpu")
    want = llm.generate([PROMPT], params)[0].outputs[0]
    llm.close()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    command = resident_command(
        "serve", "--model", str(path), "--port", str(port), "--kv-cache-dtype", "bf16"
    )
    with running(command, log) as process:
        wait_healthy(process, url, log)
        client = openai.OpenAI(
            base_url=url + "/v1", api_key="unused", max_retries=0, timeout=patience(12)
        )
        reply = client.completions.create(
            model=str(path),
            prompt=PROMPT,
            max_tokens=NEW,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
    assert reply.usage.completion_tokens == NEW and len(want.token_ids) == NEW and want.text
    assert reply.choices[0].text == want.text, log.read_text()[-2000:]


def test_a_cut_off_gguf_file_stops_the_server_with_a_clear_error(tmp_path):
    """The CLI starts its early region for the file before the load finds it truncated:
    the server still says what is wrong and exits."""
    whole = write_tiny_block_gguf(tmp_path / "whole.gguf").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(whole[: len(whole) * 2 // 3])
    command = resident_command("serve", "--model", str(path), "--port", str(free_port()))
    done = subprocess.run(command, capture_output=True, text=True, timeout=patience(12))
    assert done.returncode != 0
    assert "truncated or corrupt" in done.stdout + done.stderr, done.stderr[-2000:]
