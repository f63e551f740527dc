"""`resident bench`: any model the engine loads can be measured, and a bad one is a message.

(`resident bench throughput` runs end to end in test_throughput_bench.py.)
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent.cli import app


def bench(*args: str):
    return CliRunner().invoke(app, ["bench", *args])


@pytest.mark.parametrize("command", ["throughput", "accuracy", "prefix"])
def test_a_bad_model_path_is_a_message_not_a_traceback(tmp_path, command):
    result = bench(command, "--model", str(tmp_path / "no-such-model"))
    assert result.exit_code == 2, result.output
    assert "error: Unknown model" in result.output
    # An uncaught error would be the exception itself (exit code 1), not typer's exit.
    assert isinstance(result.exception, SystemExit)


def test_prefix_bench_asks_for_the_model_it_serves(tiny_llama_dir):
    """Not the default model's name, which the server would answer with 404."""
    result = bench("prefix", "--model", str(tiny_llama_dir), "--prefix-tokens", "64", "--json")
    assert result.exit_code == 0, result.output
    measured = json.loads(result.output)
    assert measured["model"] == str(tiny_llama_dir)
    assert measured["prompt_tokens"] > 64
    assert measured["cached_tokens_warm"] >= 48  # the shared prefix came from the cache
    assert measured["cached_tokens_cold"] == 0
