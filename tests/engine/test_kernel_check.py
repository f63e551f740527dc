"""The compile check's own logic: model shapes, representative sizes, verdicts, the table.

The compiling itself is in test_gpu_compile.py (a process of its own).
"""

from __future__ import annotations

import pytest

from engine.devtools.kernel_check.shapes import (
    EngineLimits,
    first_of_each,
    last_of_each,
    model_shapes,
    split_points,
)


def test_every_supported_family_is_planned_with_its_published_shape():
    shapes = {s.name: s for s in model_shapes()}
    kimi, glm45, glm9b = shapes["kimi-k2"], shapes["glm-4.5"], shapes["glm-4-9b"]
    assert (kimi.attention, kimi.lora_rank, kimi.rope_dim, kimi.q_heads) == ("mla", 512, 64, 64)
    assert kimi.weight_forms == ("fp8",) and shapes["kimi-k2.5"].weight_forms == ("fp8", "int4")
    assert shapes["kimi-k2.5"].int4_group == 32
    assert (glm45.q_heads, glm45.kv_heads, glm45.head_dim, glm45.experts) == (96, 8, 128, 160)
    assert glm45.weight_forms == ("bf16", "fp8") and glm9b.experts == 0
    assert shapes["smollm2-135m"].tp_degrees() == [1]  # 9 heads split over no power of two
    # Per-rank heads as the pool sizes them: fewer KV heads than ranks keep one each.
    assert glm45.rank_heads(8) == (12, 1) and glm9b.rank_heads(4) == (8, 1)
    assert kimi.rank_heads(8) == (8, 1)


def test_the_layer_ops_widths_come_from_the_configs():
    """Norm rows besides the hidden size, rotary widths and shared experts, per family."""
    shapes = {s.name: s for s in model_shapes()}
    kimi, glm45, smollm = shapes["kimi-k2"], shapes["glm-4.5"], shapes["smollm2-135m"]
    assert (kimi.norm_widths, kimi.rotary_dims, kimi.shared_experts) == ((1536, 512), (64,), 1)
    assert (glm45.norm_widths, glm45.rotary_dims) == ((128,), (64,))  # q/k norms, factor 0.5
    assert shapes["glm-4.5-air"].norm_widths == ()  # no q/k norms
    assert smollm.rotary_dims == (32, 64) and smollm.shared_experts == 0  # no factor: both


def test_defaults_come_from_the_engine_config():
    limits = EngineLimits.defaults()
    assert (limits.page_size, limits.max_batch, limits.max_tokens) == (16, 64, 2048)


def test_representatives_are_one_size_per_distinct_choice():
    def bucket(m):
        return 16 if m <= 16 else 32 if m <= 64 else 64

    assert first_of_each(bucket, range(1, 200)) == [1, 17, 65]
    assert last_of_each(bucket, range(1, 200)) == [16, 64, 199]


def test_split_points_reach_every_merge_width_the_planner_gives():
    pytest.importorskip("triton")
    from engine.attention.triton.common import plan_splits

    def plan(batch, context):
        return plan_splits(batch, context, 32, 132)[0]

    points = split_points(plan, 64, 131072, 256)
    widths = [1 << (plan(b, c) - 1).bit_length() for b, c in points]
    assert widths == [1 << i for i in range(10)]  # 1 .. 512: 261 splits at 100,096 tokens


def test_verdicts_and_the_table():
    from engine.devtools.kernel_check.gpus import H200
    from engine.devtools.kernel_check.verdict import coverage_problems, problems, summary, table

    ok = dict(gpu="H200", sm="sm_90", kernel="_k", module="engine.gpu_kernels.fp8_block_gemm",
              config="BLOCK_M=16 warps=4", registers=80, spilled=0, shared=30720)  # fmt: skip
    broken = dict(ok, kernel="_bad", registers=None, spilled=None, shared=None,
                  error="NameError: x (at 3:4)")  # fmt: skip
    assert problems(ok, H200) == []
    assert problems(broken, H200) == ["does not compile for sm_90: NameError: x (at 3:4)"]
    rows = [dict(ok, problems=[]), dict(broken, problems=problems(broken, H200))]
    coverage = coverage_problems(rows, {"engine.gpu_kernels.w4a16._w4a16_kernel": "_w4a16_kernel"})
    assert coverage and "launched by nothing the check plans" in coverage[0]
    report = dict(rows=rows, coverage=coverage, gpus=["H200 sm_90"], compiled=1, cached=1,
                  seconds=2.0)  # fmt: skip
    text = table(report).splitlines()
    assert text[0].split() == ["gpu", "kernel", "regs", "spill", "shared", "config"]
    assert any(line.startswith("FAILED H200 _bad [BLOCK_M=16 warps=4]: does not") for line in text)
    expected = (
        "kernel compile check (H200 sm_90): 2 launches 2 FAILED (1 compiled, 1 cached, 2.0 s)"
    )
    assert text[-1] == summary(report) == expected


def test_compile_errors_are_summarized_with_the_place_and_the_fix():
    from engine.devtools.kernel_check.compiler import summarize_error

    error = Exception(
        "at 43:32:\n    w, _ = load_weight_tile(..., INT4, ...)\n        ^\n"
        'NameError("Cannot access global variable INT4 from within @jit\'ed function. Triton...")'
    )
    assert summarize_error(error) == (
        "Cannot access global variable INT4: a module global read inside a kernel must be a "
        "tl.constexpr(...) (at 43:32)"
    )


PTX_SAMPLES = """
    wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%f1, %f2}, %rd1, %rd2, p, 1, 1;
    mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f3}, {%r1}, {%r2}, {%f4};
    mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f5}, {%r3}, {%r4}, {%f6};
    tcgen05.mma.cta_group::1.kind::f8f6f4 [ %r366 + 0 ], [ %r367 + 0 ], %rd149, %r368, %p11;
"""


def test_tensor_core_instructions_are_read_from_the_ptx():
    from engine.devtools.kernel_check.compiler import tensor_core_ops

    assert tensor_core_ops(PTX_SAMPLES) == [
        "mma.sync m16n8k16 f16.f16",
        "tcgen05.mma f8f6f4",
        "wgmma m64n16k32 e4m3.e4m3",
    ]
    assert tensor_core_ops("add.f32 %f1, %f2, %f3;") == []


@pytest.mark.parametrize(
    "module, config, mma, fails",
    [
        ("engine.attention.triton.decode", "BLOCK_N=64 FP8_DOT=True warps=4", ["wgmma m64n16k32 e4m3.e4m3"], False),
        ("engine.attention.triton.decode", "BLOCK_N=64 FP8_DOT=True warps=4", ["tcgen05.mma f8f6f4"], False),
        # Converted to fp16 first: the FP8 dot lost its point.
        ("engine.attention.triton.decode", "BLOCK_N=32 FP8_DOT=True warps=4", ["mma.sync m16n8k16 f16.f16"], True),
        ("engine.attention.triton.mla_decode", "FP8_DOT=True warps=8", [], True),
        ("engine.attention.triton.mla_decode", "FP8_DOT=False warps=8", ["mma.sync m16n8k16 bf16.bf16"], False),
    ],
)  # fmt: skip
def test_fp8_dots_must_run_on_e4m3_tensor_cores(module, config, mma, fails):
    from engine.devtools.kernel_check.gpus import H200
    from engine.devtools.kernel_check.verdict import problems

    row = dict(module=module, config=config, mma=mma, registers=128, spilled=0, shared=1024)
    found = problems(row, H200)
    assert bool(found) == fails
    if fails:
        assert "not e4m3 on tensor cores" in found[0]
