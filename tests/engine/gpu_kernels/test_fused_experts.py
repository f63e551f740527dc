"""A loaded MoE block's experts stacked for the fused kernel: the kernel's output equals
the expert-by-expert loop, the experts' parameters become views of the stack (held once),
and an expert-parallel rank's stack holds only its experts (others contribute nothing)."""

from __future__ import annotations

import pytest
import torch

from engine.collectives import parallel
from engine.devtools.testing.checkpoints import make_checkpoint
from engine.gpu_kernels.fused_moe import fused_moe
from engine.models.loader import load_model


@pytest.fixture(autouse=True)
def as_on_a_gpu(monkeypatch):
    """INT4 layers keep the checkpoint's word order, as they do on a GPU (on a CPU with
    the C kernels they are re-tiled for those)."""
    from engine.cpu_kernels import library

    monkeypatch.setattr(library, "unavailable", lambda: "the GPU layout, for this test")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused")
    return {
        "dense": make_checkpoint("glm4_moe", root / "dense").path,
        "int4": make_checkpoint("glm4_moe", root / "int4", quantization="int4_experts").path,
        "fp8": make_checkpoint("glm4_moe", root / "fp8", quantization="fp8_block").path,
        # Experts of intermediate 128: gate and up each start on a 128-row block.
        "fp8_aligned": make_checkpoint(
            "glm4_moe", root / "fp8a", quantization="fp8_block", moe_intermediate_size=128
        ).path,
    }


@pytest.mark.parametrize("kind", ["dense", "int4"])
@pytest.mark.parametrize("expert_parallel", [False, True])
def test_stacked_experts_compute_what_the_loop_computes(checkpoints, kind, expert_parallel, seed):
    if expert_parallel:
        parallel.set_layout(parallel.ParallelLayout(2, 1, expert_parallel=True))
    try:
        model, _, _ = load_model(checkpoints[kind], torch.float32, torch.device("cpu"))
    finally:
        parallel.set_layout(parallel.ParallelLayout())
    moe = model.model.layers[1].mlp
    first = next(e for e, here in zip(moe.experts, moe.local, strict=True) if here)
    assert moe.use_fused_kernel()
    stacked = moe.fused.w13 if kind == "dense" else moe.fused.w13_packed
    held = first.gate_up_proj.weight if kind == "dense" else first.gate_up_proj.weight_packed
    assert held.data_ptr() == stacked.data_ptr()  # a view, not a copy
    x = torch.randn(6, 64)
    weights, ids = moe.gate(x)
    want = moe.run_experts(x, weights, ids)
    got = fused_moe(x, moe.local_index[ids], weights, moe.fused)
    # float32 both ways; the kernel sums each expert's products in another order.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["fp8", "fp8_aligned"])
def test_fp8_experts_stack_with_their_block_grids(checkpoints, kind, seed):
    model, _, _ = load_model(checkpoints[kind], torch.float32, torch.device("cpu"))
    moe = model.model.layers[1].mlp
    assert moe.use_fused_kernel()
    gate_up = moe.experts[0].gate_up_proj
    if kind == "fp8_aligned":  # the layers' own grids, stacked as views (held once)
        assert gate_up.method.scale_rows == 128 and gate_up.weight_scale.shape == (2, 1)
        assert gate_up.weight_scale.data_ptr() == moe.fused.w13_scale_inv.data_ptr()
    else:  # gate and up of 32 rows each: per-row scales, each half's grid derived
        assert gate_up.method.scale_rows == 1
        assert moe.fused.w13_scale_inv.shape == (8, 2, 1)
    x = torch.randn(6, 64)
    weights, ids = moe.gate(x)
    want = moe.run_experts(x, weights, ids)
    got = fused_moe(x, moe.local_index[ids], weights, moe.fused)
    # The kernel quantizes activations to e4m3 per 128 values (DeepSeek's recipe), a
    # relative error of at most 2**-4 per product term, twice (gate/up, then down):
    # well under 10% of the output's scale over these random-sign sums.
    assert (got - want).abs().max() <= 0.1 * want.abs().max()
