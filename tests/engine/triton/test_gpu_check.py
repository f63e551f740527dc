"""bench/gpu_check.py runs here as it will on the H200: plan, a tiny smoke run, the verdicts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_plans_every_context_and_batch(gpu_check, capsys):
    assert gpu_check.main(["--dry-run"]) == 0
    planned = json.loads(capsys.readouterr().out)
    points = {(r["context"], r["batch"]) for r in planned["runs"]}
    assert points == {(c, b) for c in (8192, 32768, 131072) for b in (1, 16, 64)}
    big = max(planned["runs"], key=lambda r: (r["context"], r["batch"]))
    assert big["gqa_bf16_bytes"] == 64 * 131072 * 2 * 8 * 128 * 2 == 2 * big["gqa_fp8_bytes"]
    assert planned["largest_storage_bytes"] < 100 * 2**30  # fits an H200 with room to spare
    one = next(r for r in planned["runs"] if (r["context"], r["batch"]) == (32768, 1))
    splits, size = one["gqa_splits"]
    assert splits > 1 and splits * size >= 32768  # batch 1 at 32k is split across the GPU
    kimi_experts = 384 * 3 * 7168 * 2048  # routed expert parameters of one Kimi layer
    assert planned["quant"]["moe_weight_bytes"]["fp8"] == kimi_experts


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rehearsal; a GPU runs the real one")
def test_smoke_run_checks_times_and_reports(gpu_check, tmp_path, capsys):
    out = tmp_path / "check.json"
    assert gpu_check.main(["--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["env"]["interpreter"] is True
    checks = result["correctness"]
    assert len(checks) == 14 and all(c["ok"] for c in checks), checks  # GQA, MLA, DSA
    assert {r["kind"] for r in result["decode"]} == {"gqa", "mla"}
    assert all(r["bf16_ms"] > 0 and r["fp8_ms"] > 0 for r in result["decode"])
    assert {(r["block_n"], r["batch"]) for r in result["decode_tile_sweep"]} == {
        (n, b) for n in (16, 32) for b in (1, 3)
    }
    quant = result["quant"]
    assert len(quant["checks"]) == 6 and all(c["ok"] for c in quant["checks"]), quant["checks"]
    assert [r["kernel"] for r in quant["timings"]] == [
        "w4a16", "fp8_block", "fused_moe_bf16", "fused_moe_fp8", "fused_moe_int4"
    ]  # fmt: skip
    assert all(r["kernel_ms"] > 0 and r["torch_bf16_ms"] > 0 for r in quant["timings"])
    assert [(r["model"], r["graphs"]) for r in result["e2e"]] == [
        ("glm4_moe", False), ("glm4_moe", True), ("kimi", False), ("kimi", True)
    ]  # fmt: skip
    # No GPU: the graph runs decode eagerly too, with the same tokens.
    assert [r.get("tokens_equal_to_eager") for r in result["e2e"] if r["graphs"]] == [
        "2/2 sequences"
    ] * 2
    assert all(r.get("decode_tok_s", 0) > 0 for r in result["e2e"]), result["e2e"]
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("correctness: 14/14 ok")  # the table comes last
    assert printed[-2] == "quantized kernels: 6/6 ok"


def test_targets_and_table_flag_misses(gpu_check):
    rows = [
        dict(kind="gqa", context=32768, batch=16, bf16_ms=2.0, fp8_ms=1.0, speedup=2.0,
             bf16_gbs=3000.0, fp8_gbs=3000.0, fp8_widen_ms=1.9),
        dict(kind="gqa", context=32768, batch=1, bf16_ms=0.1, fp8_ms=0.08, speedup=1.25,
             bf16_gbs=600.0, fp8_gbs=400.0, fp8_widen_ms=0.09),
        dict(kind="mla", context=32768, batch=1, bf16_ms=0.1, fp8_ms=0.1, speedup=1.0,
             bf16_gbs=1.0, fp8_gbs=1.0, fp8_widen_ms=0.1),
        dict(kind="gqa", context=8192, error="RuntimeError('out of memory')"),
    ]  # fmt: skip
    verdicts = gpu_check.targets(rows, copy_gbs=4000.0)
    assert [(t["batch"], t["speedup_ok"], t["bandwidth_ok"]) for t in verdicts] == [
        (16, True, True),
        (1, False, False),
    ]
    result = {
        "env": {"device": "H200"},
        "copy_gbs": 4000.0,
        "decode": rows,
        "e2e": [{"model": "kimi", "backend": "triton", "kv": "fp8_e4m3", "error": "boom"}],
        "correctness": [{"check": "gqa decode", "ok": False}],
        "targets": verdicts,
    }
    text = gpu_check.table(result)
    assert "FAILED: gqa decode" in text and "out of memory" in text and "boom" in text
    assert text.splitlines()[-1].startswith("target @32k batch 1: speedup 1.25")


def test_quant_only_table_flags_failures(gpu_check):
    """--quant-only results have no attention parts; the table still reports the kernels."""
    quant = {
        "checks": [{"check": "w4a16 1x7168x18432", "ok": True},
                   {"check": "fused moe int4 64 tokens", "ok": False, "error": "boom"}],
        "timings": [{"kernel": "w4a16", "m": 1, "k": 7168, "n": 18432, "kernel_ms": 0.05,
                     "torch_bf16_ms": 0.2, "torch_dequant_ms": 1.5}],
    }  # fmt: skip
    lines = gpu_check.table({"env": {"device": "H200"}, "quant": quant, "e2e": []}).splitlines()
    assert lines[0] == "on H200"
    assert "kernel    0.050 ms, torch_bf16 0.200, torch_dequant 1.500" in lines[1]
    assert lines[-2] == "quantized kernels: 1/2 ok; FAILED: fused moe int4 64 tokens"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rehearsal; a GPU captures")
def test_graph_checks_rehearse_on_fixed_buffers():
    """bench/gpu_check_graphs.py's step check on CPU: the graphs' fixed buffers, eagerly."""
    from bench.gpu_check_graphs import run_graph_checks

    assert run_graph_checks(torch.device("cpu")) == {
        "ok": True,
        "checks": [],
        "note": "no GPU: nothing to capture",
    }
    result = run_graph_checks(torch.device("cpu"), rehearse=True)
    assert result["ok"], result
    assert [c["check"] for c in result["checks"]] == [
        "graph step vs eager, fp8_e4m3 KV",
        "graph step vs eager, bf16 KV",
    ]
    assert all(c["max_abs_diff"] <= 1e-5 for c in result["checks"])
