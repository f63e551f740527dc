"""Every engine kernel compiles for Hopper (and Blackwell) here, without a GPU, and fits it.

The check runs as `python -m engine.devtools.kernel_check` in a process of its own:
a process that imported Triton under TRITON_INTERPRET=1 (this one, on a
CPU) cannot compile for a GPU. Results are cached in the user cache by
kernel source and configuration, so only changed kernels compile again.
Deliberately broken kernels (tests/engine/broken_kernels.py) show that the
check fails them with a message that says what to fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from engine.devtools.kernel_check.gpus import H200  # noqa: E402
from engine.devtools.kernel_check.verdict import problems  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip


@pytest.fixture(scope="module")
def broken() -> dict:
    done = _run("tests.engine.broken_kernels")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_module_global_fails_with_the_fix_named(broken):
    (problem,) = broken["module_global"]["problems"]
    assert problem.startswith("does not compile for sm_90: ")
    assert "Cannot access global variable SCALE" in problem
    assert "must be a tl.constexpr(...)" in problem and "(at 3:" in problem


def test_tiles_beyond_shared_memory_fail_with_the_sizes(broken):
    row = broken["large_tiles"]
    assert row["shared"] > H200.shared_limit
    assert f"needs {row['shared']:,} B of shared memory; one H200 block may use 232,448 B " \
        "(227 KiB)" in row["problems"][0]  # fmt: skip


def test_spills_fail_only_where_they_must_not_happen():
    row = dict(module="engine.gpu_kernels.w4a16", registers=255, spilled=252, shared=1024)
    (problem,) = problems(row, H200)
    assert "spills 252 B per thread to local memory at 255 registers" in problem
    assert "W4A16 GEMM must not spill" in problem
    assert problems(dict(row, module="engine.attention.triton.prefill"), H200) == []


def test_every_engine_kernel_compiles_for_hopper_without_spills(tmp_path):
    report_path = tmp_path / "kernels.json"
    done = _run("engine.devtools.kernel_check", "--json", str(report_path), "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_path.read_text())
    assert report["coverage"] == [] and not any(r["problems"] for r in report["rows"])
    hopper = [r for r in report["rows"] if r["sm"] == "sm_90"]
    assert {r["kernel"] for r in hopper} >= {
        "_gqa_decode_split_kernel", "_merge_splits_kernel", "_mla_decode_split_kernel",
        "_prefill_kernel", "_write_pair_kernel", "_act_quant_kernel", "_w4a16_kernel",
        "_fp8_block_kernel", "_moe_gemm_kernel", "_rms_norm_kernel", "_silu_mul_kernel",
        "_rope_kernel", "_index_scores_kernel",
    }  # fmt: skip
    # Sparse MLA decode (GLM-5.x): the MLA kernel over selected slots, as one-token pages.
    assert any(r["kernel"] == "_mla_decode_split_kernel" and "PAGE_SIZE=1 " in r["config"]
               for r in hopper)  # fmt: skip
    assert all(r["registers"] > 0 and r["shared"] <= H200.shared_limit for r in hopper)
    # The deployments planned: every model family, KV dtype and weight form.
    used = " ".join(u for r in hopper for u in r["used_by"])
    for deployment in ("kimi-k2 tp8 kv fp8_e4m3", "glm-4.5 tp8 kv bf16", "kimi-k2.5 int4",
                       "glm-4.5 fp8", "glm-4-9b", "smollm2-135m", "glm-5 tp8 kv fp8_e4m3"):  # fmt: skip
        assert deployment in used, deployment
    assert done.stdout.strip().splitlines()[-1].startswith("kernel compile check (H200 sm_90")
