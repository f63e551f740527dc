"""`resident bench throughput` runs end to end and reports every figure it claims."""

from __future__ import annotations

import pytest

from engine.devtools.benchmarks.throughput import format_table, run_throughput
from engine.model_files.store import default_model_dir, is_complete


@pytest.mark.skipif(
    not is_complete(default_model_dir()), reason="default model not pulled: resident models pull"
)
def test_throughput_bench_measures_decode_and_cold_prefill_against_transformers():
    result = run_throughput(
        "smollm2-135m-instruct", max_tokens=2, batch=2, prefill_tokens=64, repeats=2
    )
    assert result["prefill_tokens"] == 64 and result["repeats"] == 2
    assert set(result["runs"]) == {"engine_bf16", "engine_fp8_e4m3", "transformers_bf16"}
    for run in result["runs"].values():
        assert run["single_tok_s"] > 0 and run["batch_tok_s"] > 0 and run["prefill_tok_s"] > 0
    assert (
        result["runs"]["engine_fp8_e4m3"]["kv_bytes_per_token"] * 2
        == (result["runs"]["engine_bf16"]["kv_bytes_per_token"])
    )
    assert set(result["speedup_vs_transformers"]["engine_bf16"]) == {"single", "batch", "prefill"}
    assert "prefill x" in format_table(result)


def test_bench_refuses_a_prefill_longer_than_the_context_before_measuring(tiny_llama_dir):
    from typer.testing import CliRunner

    from agent.cli import app

    args = ["bench", "throughput", "--model", str(tiny_llama_dir), "--prefill-tokens", "100000"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--prefill-tokens 100000 does not fit the model's context" in result.output
    assert "Traceback" not in result.output
