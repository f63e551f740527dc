"""`bench/gpu_check.py --quick` on CPU: parts that fail do not stop the others; the verdicts.

The run itself needs an H200; what is checked here is the logic around it:
part isolation and the time budget, and the verdict table over results.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # `bench` from the checkout

from bench.gpu_check_quick import run_part, run_quick  # noqa: E402
from bench.gpu_check_verdicts import TARGETS, verdict_table, verdicts  # noqa: E402


def test_a_failing_part_is_recorded_and_the_next_one_runs():
    result: dict = {}
    later = time.monotonic() + 60

    def boom():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    run_part(result, "decode", boom, later)
    run_part(result, "quant", lambda: {"checks": []}, later)
    run_part(result, "e2e", lambda: [{"model": "kimi"}], later)
    run_part(result, "profile", lambda: {"gpu_busy": 1.0}, time.monotonic() - 1)
    assert "illegal memory access" in result["decode"]["error"] and result["decode"]["trace"]
    assert result["quant"]["checks"] == [] and "seconds" in result["quant"]
    assert result["e2e"] == [{"model": "kimi"}] and "e2e_seconds" in result
    assert result["profile"] == {"error": "skipped: time budget"}


def _result() -> dict:
    decode = [
        dict(kind="gqa", context=32768, batch=1, speedup=1.2, fp8_gbs=2500.0),
        dict(kind="gqa", context=32768, batch=16, speedup=1.8, fp8_gbs=3300.0),
        dict(kind="gqa", context=32768, batch=64, speedup=1.9, fp8_gbs=3400.0),
        dict(kind="mla", context=32768, error="RuntimeError('out of memory')"),
    ]
    timings = [
        dict(kernel="w4a16", m=1, kernel_ms=0.05, weight_gbs=2700.0, torch_bf16_ms=0.08),
        dict(kernel="w4a16", m=2048, kernel_ms=1.2, weight_gbs=60.0, torch_bf16_ms=0.67),
        dict(kernel="fp8_block", m=1, gemm_only_ms=0.07, scaled_mm_rowwise_ms=0.066),
        dict(kernel="fp8_block", m=2048, gemm_only_ms=0.5, scaled_mm_rowwise_ms=0.378),
        dict(kernel="fused_moe_bf16", tokens=64, kernel_ms=6.8),
        dict(kernel="fused_moe_int4", tokens=64, kernel_ms=6.0),
    ]
    return {
        "env": {"device": "NVIDIA H200"},
        "elapsed_s": 301.0,
        "compile": {"ok": True, "summary": "kernel compile check (H200 sm_90): 92 launches ok"},
        "tests": {"error": "skipped: time budget"},
        "correctness": [{"check": "gqa decode", "ok": True}],
        "copy_gbs": 4237.0,
        "decode": decode,
        "quant": {"checks": [{"check": "w4a16", "ok": False}], "timings": timings},
        "layer_ops": {"checks": [{"check": "rope glm-4.5 1 rows", "ok": True, "exact": True}]},
        "e2e": [
            dict(
                model="glm4_moe", backend="triton", kv="fp8_e4m3", graphs=False, decode_tok_s=1300.0
            ),
            dict(
                model="glm4_moe",
                backend="triton",
                kv="fp8_e4m3",
                graphs=True,
                decode_tok_s=5200.0,
                tokens_equal_to_eager="32/32 sequences",
            ),
            dict(model="glm4_moe", backend="triton", kv="bf16", graphs=True, decode_tok_s=5000.0),
        ],
        "profile": {"gpu_busy": 0.6, "launches_per_step": 412.0},
        "graphs": {"ok": True, "checks": [{"check": "graph step vs eager", "ok": True}]},
    }


def test_each_target_is_met_not_met_or_not_measured_with_its_reason():
    rows = {r["target"]: r for r in verdicts(_result(), TARGETS)}
    met = {name: r["met"] for name, r in rows.items()}
    assert met["every kernel compiles for sm_90, no spills"] is True
    assert met["Triton/GPU-kernel tests on CUDA"] is None
    assert rows["Triton/GPU-kernel tests on CUDA"]["note"] == "skipped: time budget"
    assert met["quantized kernels vs torch"] is False
    assert met["layer ops (norm, SwiGLU, rotary) vs torch"] is True
    assert met["GQA decode 32k, batch >= 16: FP8 vs BF16"] is True  # 1.8 and 1.9 >= 1.7
    assert met["GQA decode 32k, batch >= 16: FP8 share of copy"] is True  # 3300 / 4237 = 0.78
    assert met["GQA decode 32k, batch 1: FP8 share of copy"] is True  # 0.59
    assert met["MLA decode 32k, batch >= 16: FP8 share of copy"] is None  # its shape failed
    assert met["W4A16 M <= 16: weight bytes/s, share of copy"] is True  # 0.64
    assert met["W4A16 M = 2048: speed vs torch BF16"] is False  # 0.56x < 1 / 1.5
    assert met["FP8-block M <= 64: speed vs _scaled_mm rowwise"] is True  # 0.94x
    assert met["FP8-block M = 2048: speed vs _scaled_mm rowwise"] is True  # 0.76x
    assert met["fused MoE T = 64: INT4 speed vs BF16 experts"] is True
    assert met["GLM-MoE batch 32: decode tokens/s"] is True
    assert met["end to end: FP8 KV vs BF16 KV"] is True
    assert met["CUDA-graph decode vs eager (logits, traffic tokens)"] is True
    assert met["CUDA graphs vs eager decode (FP8 KV)"] is True  # 4.0x; the graph row counts
    assert rows["CUDA graphs vs eager decode (FP8 KV)"]["note"] == (
        "greedy tokens equal to eager: 32/32 sequences"
    )
    assert met["decode step: GPU busy share"] is False
    assert rows["decode step: GPU busy share"]["note"] == "412 host launch calls per step"


def test_the_table_ends_with_the_count():
    text = verdict_table(_result()).splitlines()
    assert text[0] == "gpu_check --quick on NVIDIA H200, 301 s"
    assert text[-1] == "targets: 14 met, 3 not met, 3 not measured"
    assert any("NOT MET" in line and "GPU busy" in line for line in text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_quick_refuses_to_run_without_a_gpu(tmp_path, capsys):
    assert run_quick(str(tmp_path / "out.json")) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
