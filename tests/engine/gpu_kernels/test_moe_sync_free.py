"""MoE routing, alignment and the fused SparseMoE step read nothing back from the device.

Issue 28 wants decode captured as a CUDA graph, and a capture cannot hold a
host synchronisation (`.item()`, `torch.bincount` on CUDA, a boolean mask...).
engine.devtools.testing.capture_hazards sees those as the aten operators they are on
CPU too, so each step runs once under it here: on CPU with the fused kernels
in Triton's interpreter (conftest sets TRITON_INTERPRET), on a GPU compiled.
Each step's results are checked as well: the layout (moe_align), the expert
loop's output (SparseMoE); route()'s decisions are test_glm4_moe's.
"""

from __future__ import annotations

import pytest
import torch

from engine.collectives import parallel
from engine.devtools.testing.capture_hazards import capture_hazards
from engine.gpu_kernels.moe_align import moe_align
from engine.layers.moe_routing import RoutingConfig, route
from tests.engine.gpu_kernels.test_moe_align import check_layout


@pytest.mark.parametrize(
    "tokens,top_k,experts,block_m",
    [(1, 8, 384, 16), (5, 2, 8, 16), (64, 2, 8, 64), (37, 3, 6, 4)],
    ids=["kimi_decode", "small", "prefill", "many_blocks"],
)
def test_moe_align_is_sync_free(seed, device, tokens, top_k, experts, block_m):
    ids = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)]).to(device)
    assert capture_hazards(moe_align, ids, experts, block_m) == []
    check_layout(ids.cpu(), experts, block_m)


def test_moe_align_drops_other_ranks_ids_without_a_sync(device):
    """Ids outside [0, E) (another expert-parallel rank's, or -1) take the same path."""
    ids = torch.tensor([[0, -1], [5, 1], [-1, -1], [3, 3]], device=device)
    assert capture_hazards(moe_align, ids, 4, 4) == []
    check_layout(ids.cpu(), 4, 4)


ROUTINGS = {
    # Kimi K2: sigmoid scores, noaux_tc correction bias, 8 groups ranked by their top-2 sum
    "sigmoid_noaux_tc_grouped": RoutingConfig(
        num_experts=384, top_k=8, num_groups=8, top_groups=4, scaling=2.827
    ),
    # DeepSeek V2 style: softmax scores, plain top-k, weights as they are
    "softmax_greedy": RoutingConfig(
        num_experts=16,
        top_k=2,
        scoring="softmax",
        group_ranking="none",
        correction_bias=False,
        normalize=False,
    ),
    "softmax_group_max": RoutingConfig(
        num_experts=16,
        top_k=4,
        num_groups=4,
        top_groups=2,
        scoring="softmax",
        group_ranking="max",
        correction_bias=False,
    ),
}


@pytest.mark.parametrize("routing", ROUTINGS.values(), ids=ROUTINGS.keys())
@pytest.mark.parametrize("tokens", [1, 7])
def test_route_is_sync_free(seed, device, routing, tokens):
    logits = torch.randn(tokens, routing.num_experts, device=device)
    bias = torch.randn(routing.num_experts, device=device) if routing.correction_bias else None
    assert capture_hazards(route, logits, routing, bias) == []


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    """INT4 layers keep the checkpoint's word order, as on a GPU (test_fused_experts.py)."""
    from engine.cpu_kernels import library

    monkeypatch.setattr(library, "unavailable", lambda: "the GPU layout, for this test")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from engine.devtools.testing.checkpoints import make_checkpoint

    root = tmp_path_factory.mktemp("sync_free")
    return {
        "dense": make_checkpoint("glm4_moe", root / "dense").path,
        "int4": make_checkpoint("glm4_moe", root / "int4", quantization="int4_experts").path,
    }


def _fused_moe_block(checkpoint, device, expert_parallel: bool):
    """Layer 1's SparseMoE with its experts stacked for the fused kernel."""
    from engine.models.loader import load_model

    if expert_parallel:  # this rank holds half the experts; the others' ids contribute nothing
        parallel.set_layout(parallel.ParallelLayout(2, 1, expert_parallel=True))
    try:
        model, _, _ = load_model(checkpoint, torch.float32, device)
    finally:
        parallel.set_layout(parallel.ParallelLayout())
    moe = model.model.layers[1].mlp
    assert moe.use_fused_kernel()
    return moe


@pytest.mark.parametrize("kind", ["dense", "int4"])
@pytest.mark.parametrize("expert_parallel", [False, True], ids=["all_experts", "expert_parallel"])
def test_sparse_moe_fused_forward_is_sync_free(
    checkpoints, as_on_a_gpu, kind, expert_parallel, device, seed, monkeypatch
):
    pytest.importorskip("triton")
    from engine.gpu_kernels import fused_moe as fused_module

    moe = _fused_moe_block(checkpoints[kind], device, expert_parallel)
    launches = []
    kernel = fused_module.fused_moe
    monkeypatch.setattr(fused_module, "fused_moe", lambda *a: launches.append(1) or kernel(*a))
    x = torch.randn(6, 64, device=device)
    with torch.no_grad():
        assert capture_hazards(moe, x) == []
        assert launches, "forward did not take the fused kernel"
        got = moe(x)
        weights, ids = moe.gate(x)
        want = moe.run_experts(x, weights, ids) + moe.shared_experts(x)
    # float32 both ways; the kernel sums each expert's products in another order.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
