"""`resident bench accuracy`: its JSON shape, on tiny checkpoints, in seconds."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from agent.cli import app
from engine import LLM
from engine.devtools.benchmarks.accuracy import python_text, run_accuracy, score_window

SMALL = dict(
    contexts=(32, 64),
    python_windows=(2, 1),
    prose_windows=(1, 1),
    decode_tokens=4,
    calibration_tokens=32,
)
ROW_KEYS = {
    "variant",
    "text",
    "context",
    "windows",
    "positions",
    "decode_positions",
    "ppl",
    "delta_pct",
    "top1_agreement",
    "mean_abs_nll_diff",
}


@pytest.fixture(scope="module")
def result(tiny_llama_dir):
    variants = ("fp8_per_tensor", "fp8_hadamard", "bf16_hadamard")
    return run_accuracy(str(tiny_llama_dir), variants=variants, **SMALL)


def test_json_shape(result):
    json.dumps(result)  # one JSON object
    assert result["benchmark"] == "accuracy" and result["model_dtype"] == "bfloat16"
    assert set(result["variants"]) == {"bf16", "fp8_per_tensor", "fp8_hadamard", "bf16_hadamard"}
    assert result["variants"]["fp8_hadamard"]["kv_rotation"] == "hadamard"
    assert result["variants"]["fp8_per_tensor"]["kv_scales"]["source"] == "calibrated"
    assert set(result["texts"]) == {"python", "prose"}
    assert "stdlib" in result["texts"]["python"]["source"]
    assert result["contexts"] == [32, 64]
    assert result["calibration"]["prompts"] == 2
    rows = result["rows"]
    assert len(rows) == 4 * 4  # variants (with the reference) x (text, context)
    for row in rows:
        assert set(row) == ROW_KEYS
        assert row["positions"] == row["windows"] * (row["context"] - 1)
        assert row["decode_positions"] == row["windows"] * 3  # the last token predicts nothing
        assert row["ppl"] > 1
    python_2 = [r for r in rows if r["text"] == "python" and r["context"] == 32]
    assert [r["windows"] for r in python_2] == [2] * 4
    assert result["target"]["variant"] == "fp8_hadamard" and result["target"]["context"] == 32
    assert isinstance(result["target"]["met"], bool)


def test_reference_rows_and_rotation_alone(result):
    for row in result["rows"]:
        if row["variant"] == "bf16":
            assert row["delta_pct"] == 0 and row["top1_agreement"] == 1.0
        if row["variant"] == "bf16_hadamard":  # BF16 rounding only
            assert abs(row["delta_pct"]) < 1.0 and row["top1_agreement"] >= 0.9
        if row["variant"].startswith("fp8"):  # FP8 really changes something
            assert row["mean_abs_nll_diff"] > 0
    check = result["rotation_check"]
    assert check["text"] == "python" and check["context"] == 32 and check["positions"] == 31
    exact = check["float32_rotated_vs_plain"]
    assert exact["max_abs_nll_diff"] < 1e-4 and exact["top1_agreement"] == 1.0
    rounding = check["bf16_vs_float32"]["mean_abs_nll_diff"]
    assert 0 < check["bf16_rotated_vs_plain"]["mean_abs_nll_diff"] <= 1.5 * rounding


def test_score_window_prefills_then_decodes_through_the_cache(tiny_llama_dir):
    """Scores from chunked prefill plus decode steps equal the plain prompt logits' scores."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto")
    window = python_text(llm.tokenizer, 40).ids
    scores, decoded = score_window(llm, window, decode_tokens=8)
    assert decoded == 7 and scores.shape == (39, 2)
    logits = llm.prompt_logits(window)[:-1]
    nll = -torch.log_softmax(logits, -1).gather(1, torch.tensor(window[1:])[:, None]).squeeze(1)
    assert torch.allclose(scores[:, 0].float(), nll, atol=1e-4)
    assert torch.equal(scores[:, 1].long(), logits.argmax(-1))


def test_cli_prints_json(tiny_llama_dir):
    args = ["bench", "accuracy", "--json", "--model", str(tiny_llama_dir)]
    args += ["--variants", "fp8_hadamard", "--contexts", "32", "--windows", "1"]
    args += ["--prose-windows", "1", "--decode-tokens", "2", "--calibration", "first-prefill"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    assert [r["variant"] for r in result["rows"]] == [
        "bf16",
        "bf16",
        "fp8_hadamard",
        "fp8_hadamard",
    ]
    assert result["calibration"]["mode"] == "first-prefill"
    bad = CliRunner().invoke(app, ["bench", "accuracy", "--variants", "fp9"])
    assert bad.exit_code == 2 and "unknown variants" in bad.output
