"""`python bench/gpu_check.py --quick`: every part in one H200 run of at most 6 minutes, and verdicts.

Parts run in this order, each in `run_part`: whatever one does (an exception,
a CUDA error, a test run that fails) is written into its own entry and the
next part runs; a part that would start after the budget is marked skipped.

1. compile:     `python -m engine.devtools.kernel_check --gpu h200` (subprocess), as in `make test`
2. tests:       pytest on tests/engine/triton and tests/engine/gpu_kernels, compiled on CUDA
                (the GPU-only bit-exact tests included; needs `pip install -e '.[test]'`)
3. correctness: the attention kernels against the torch backend (gpu_check_correctness,
                gpu_check_dsa for DeepSeek sparse attention's decode)
4. decode:      device copy bandwidth, then GQA and MLA decode at 32k, batch 1/16/64
                (gpu_check_decode)
5. quant:       W4A16, FP8-block and the fused MoE (gpu_check_quant, fewer timing iterations)
5b. layer_ops:  the norm, SwiGLU and rotary kernels against TorchLayerOps (gpu_check_layer_ops)
6. e2e:         decode tokens/s of the mid-size GLM-MoE and Kimi models, FP8 and BF16 KV
7. profile:     one GLM-MoE decode run under torch.profiler: host launch calls per step
                (a replayed graph is one), kernels per step, and the share of the wall
                time the GPU was busy
8. graphs:      CUDA-graph decode against eager on a tiny Llama: one step's logits, and
                tokens under traffic (gpu_check_graphs), if time is left

`verdicts` (gpu_check_verdicts, which holds the targets) turns the results into
one row per target of the GPU-speed issue (issue 28) and per correctness part:
met, not met, or not measured (with why).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from bench.gpu_check_verdicts import verdict_table, verdicts

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 360.0  # the whole run, on one H200
# Caps on the two subprocess parts, so the timed parts after them still get their turn.
COMPILE_CAP_S, TESTS_CAP_S = 60.0, 150.0
QUICK = dict(
    contexts=[32768], batches=[1, 16, 64], gqa=(96, 8, 128), mla=(64, 512, 64), page=16,
    iters=10, warmup=2, copy_gib=4.0,
    decode_checks=[(8, 8, 128), (96, 8, 128), (32, 4, 64)], check_lens=[32768, 1, 20011],
    prefill=([512, 1, 300], [4608, 2001, 300]), mla_check_heads=[64],
    e2e_batch=32, e2e_prompt=2048, e2e_tokens=32,
    e2e_runs=[("triton", "fp8_e4m3", False), ("triton", "fp8_e4m3", True), ("triton", "bf16", True)],
)  # fmt: skip


def run_part(result: dict, name: str, fn, deadline: float) -> None:
    """result[name] = fn() or {"error": ...}; never raises; skipped past the deadline."""
    if time.monotonic() > deadline:
        result[name] = {"error": "skipped: time budget"}
        return
    start = time.monotonic()
    try:
        result[name] = fn()
    except BaseException as err:  # noqa: BLE001 - a part's failure must not stop the others
        if isinstance(err, KeyboardInterrupt):
            raise
        result[name] = {"error": repr(err)[:500], "trace": traceback.format_exc()[-2000:]}
    if isinstance(result[name], dict):
        result[name]["seconds"] = round(time.monotonic() - start, 1)
    else:
        result[f"{name}_seconds"] = round(time.monotonic() - start, 1)


def _subprocess(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=max(timeout, 1.0))  # fmt: skip


def _outcome(done: subprocess.CompletedProcess) -> dict:
    lines = done.stdout.strip().splitlines()
    return {
        "ok": done.returncode == 0,
        "summary": lines[-1] if lines else done.stderr[-500:],
        "failures": [line for line in lines if line.startswith("FAILED")][:30],
    }


def compile_part(deadline: float, out: Path) -> dict:
    args = ["-m", "engine.devtools.kernel_check", "--gpu", "h200", "--quiet", "--json", str(out)]
    return _outcome(_subprocess(args, min(COMPILE_CAP_S, deadline - time.monotonic())))


def tests_part(deadline: float) -> dict:
    try:
        import pytest  # noqa: F401
    except ImportError:  # the [test] extra: not measured, and why
        return {"error": "pytest is not installed: pip install -e '.[test]'"}
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/engine/triton",
            "tests/engine/gpu_kernels"]  # fmt: skip
    return _outcome(_subprocess(args, min(TESTS_CAP_S, deadline - time.monotonic())))


HOST_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                     "cudaGraphLaunch")  # fmt: skip


def profile_part(device) -> dict:
    """GLM-MoE decode (batch 32) under torch.profiler: launches per step, GPU-busy share."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.gpu_check_e2e import SIZES, build_model
    from engine import LLM, SamplingParams

    batch, steps, prompt = QUICK["e2e_batch"], 16, 128
    prompts = [torch.randint(10, 300, (prompt,)).tolist() for _ in range(batch)]
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model("glm4_moe", Path(tmp) / "glm", SIZES["full"], 2 * (prompt + steps))
        llm = LLM(str(path), dtype="bfloat16", kv_cache_dtype="fp8_e4m3", attention_backend="triton",
                  enable_prefix_caching=False, max_num_seqs=batch,
                  max_model_len=prompt + steps + 16, kv_memory=8.0)  # fmt: skip
        params = SamplingParams(max_tokens=steps + 1, temperature=0, ignore_eos=True)
        llm.generate(prompts, params)  # compile and warm up at these shapes
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            llm.generate(prompts, params)
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
    events = prof.events()
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    busy = sum(e.device_time_total for e in kernels) / 1e6  # microseconds -> s
    # What the host issues: one call per eager kernel, one per replayed graph.
    launches = [e for e in events if e.name in HOST_LAUNCH_CALLS]
    graphs = sum(e.name == "cudaGraphLaunch" for e in events)
    per_step = steps + 1
    return {"steps": steps, "launches_per_step": len(launches) / per_step,
            "kernels_per_step": len(kernels) / per_step, "graph_replays": graphs,
            "gpu_busy": busy / wall, "wall_s": wall, "batch": batch}  # fmt: skip


def run_quick(out: str) -> int:
    import torch

    from bench import gpu_check_decode as decode

    if not torch.cuda.is_available():
        print("--quick is the H200 run and needs a CUDA GPU; on CPU use --smoke", file=sys.stderr)
        return 2
    started = time.monotonic()
    deadline = started + BUDGET_S
    device = torch.device("cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    result: dict = {"mode": "quick", "budget_s": BUDGET_S, "env": _env(device)}

    def timed(fn, iters: int, warmup: int) -> float:
        return decode.timed_ms(fn, device, iters, warmup, flush)

    table_json = Path(out).with_name("kernel_check.json")
    run_part(result, "compile", lambda: compile_part(deadline, table_json), deadline)
    run_part(result, "tests", lambda: tests_part(deadline), deadline)
    run_part(result, "correctness", lambda: _correctness(device), deadline)
    run_part(result, "copy_gbs", lambda: decode.copy_bandwidth(QUICK, device), deadline)
    run_part(result, "decode", lambda: decode.decode_timings(QUICK, device, flush), deadline)
    run_part(result, "quant", lambda: _quant(device, timed), deadline)
    run_part(result, "layer_ops", lambda: _layer_ops(device, timed), deadline)
    from bench.gpu_check_e2e import run_e2e
    from bench.gpu_check_graphs import run_graph_checks

    run_part(result, "e2e", lambda: run_e2e(QUICK, device, deadline, "full"), deadline)
    run_part(result, "profile", lambda: profile_part(device), deadline)
    # Last: the e2e part already compares graph and eager tokens on the mid-size models.
    run_part(result, "graphs", lambda: run_graph_checks(device), deadline)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result["verdicts"] = verdicts(result)
    Path(out).write_text(json.dumps(result, indent=1, default=str))
    print(verdict_table(result))
    return 0 if all(v["met"] is not False for v in result["verdicts"]) else 1


def _env(device) -> dict:
    import torch
    import triton

    return {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
            "triton": triton.__version__}  # fmt: skip


def _correctness(device) -> list[dict]:
    from bench.gpu_check_correctness import gqa_checks, mla_checks
    from bench.gpu_check_dsa import dsa_checks

    checks = gqa_checks(QUICK, device, True) + mla_checks(QUICK, device, True)
    return checks + dsa_checks(QUICK, device)


def _layer_ops(device, timed) -> dict:
    from bench.gpu_check_layer_ops import SIZES, run_layer_ops

    SIZES.setdefault("quick", dict(SIZES["full"], iters=10))
    return run_layer_ops("quick", device, timed)


def _quant(device, timed) -> dict:
    from bench.gpu_check_quant import SIZES, run_quant

    SIZES.setdefault("quick", dict(SIZES["full"], moe_tokens=[1, 64], iters=5, warmup=1,
                                   dequant_iters=1))  # fmt: skip
    return run_quant("quick", device, timed)
