"""A MoE layer's decode rows in one C call (engine/layers/cpu_moe_block.py) against the
module path it replaces (SparseMoE.forward: the router module, route(), the routed
experts' C call, the shared expert's modules, the sum).

Tolerances. The routing's float32 router sums run in another order than torch's
product and its exp is not torch's, so a weight may differ in its last bits (1e-5
relative bounds it, 2e-6 measured); the
experts then see the same int8 activations and the kernel rounds the same values,
so the layer's outputs differ by at most a BF16 step here and there: 2^-7 of the
largest output.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.cpu_kernels import library
from engine.devtools.testing.realistic_checkpoints import q4_1_values, q8_0_values
from engine.layers.cpu_grid_weights import pack_grid_weights
from engine.layers.cpu_moe_block import MAX_ROWS, CpuMoEBlock, use_cpu_moe_blocks
from engine.layers.cpu_moe_experts import use_cpu_moe_experts
from engine.layers.layer_ops import CPU_LAYER_OPS
from engine.layers.linear_methods import DENSE
from engine.layers.moe import SparseMoE
from engine.layers.moe_routing import RoutingConfig, route
from engine.models.decoder import GatedMLP
from tests.engine.conftest import count_calls

pytestmark = pytest.mark.skipif(
    bool(library.unavailable()), reason=f"CPU kernels: {library.unavailable()}"
)
HIDDEN, INTERMEDIATE, EXPERTS = 128, 64, 16
OUTPUT_TOL = 2.0**-7  # of the largest output (module docstring)
ROUTINGS = {
    "kimi": RoutingConfig(EXPERTS, 4, scaling=2.827),
    "deepseek_v3_groups": RoutingConfig(EXPERTS, 4, num_groups=4, top_groups=2, scaling=2.5),
    "softmax_max_groups": RoutingConfig(
        EXPERTS,
        2,
        num_groups=4,
        top_groups=3,
        scoring="softmax",
        group_ranking="max",
        correction_bias=False,
        normalize=False,
    ),  # fmt: skip
    "softmax_plain": RoutingConfig(
        EXPERTS, 6, scoring="softmax", group_ranking="none", correction_bias=False
    ),
}


def _mlp(gen, intermediate: int) -> GatedMLP:
    mlp = GatedMLP(HIDDEN, intermediate, reduce=False)
    with torch.no_grad():
        for linear, grid in ((mlp.gate_up_proj, q4_1_values), (mlp.down_proj, q8_0_values)):
            linear.weight.copy_(grid(torch.randn(linear.weight.shape, generator=gen) * 0.1))
    mlp.ops = CPU_LAYER_OPS
    return mlp


def _moe(routing: RoutingConfig, shared: bool = True, seed: int = 0) -> SparseMoE:
    """A SparseMoE as the engine leaves one after loading: grid-packed BF16 experts, a
    float32 router and correction bias, the routed experts' C call installed."""
    gen = torch.Generator().manual_seed(seed)
    moe = SparseMoE(
        HIDDEN,
        routing,
        lambda _: _mlp(gen, INTERMEDIATE),
        shared_experts=_mlp(gen, 2 * INTERMEDIATE) if shared else None,
    )
    pack_grid_weights(moe, "int8")
    moe = moe.bfloat16()
    with torch.no_grad():
        moe.gate.weight.data = torch.randn(EXPERTS, HIDDEN, generator=gen) * 0.2
        if moe.gate.e_score_correction_bias is not None:
            moe.gate.e_score_correction_bias.data = torch.randn(EXPERTS, generator=gen) * 0.1
    assert use_cpu_moe_experts(moe) == 1
    return moe


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_routing_matches_the_router_module(name):
    moe = _moe(ROUTINGS[name])
    block = CpuMoEBlock.build(moe)
    x = torch.randn(MAX_ROWS, HIDDEN, generator=torch.Generator().manual_seed(1)).bfloat16()
    weights, ids = block.route(x)
    bias = moe.gate.e_score_correction_bias
    logits = F.linear(x.float(), moe.gate.weight.float())
    want_weights, want_ids = route(logits, moe.gate.routing, None if bias is None else bias.float())
    assert torch.equal(ids, want_ids)  # the same experts, in torch.topk's order
    torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shared", [True, False], ids=["shared_expert", "routed_only"])
@pytest.mark.parametrize("rows", [1, 5, MAX_ROWS])
def test_block_matches_the_module_path(shared, rows, monkeypatch):
    moe = _moe(ROUTINGS["kimi"], shared)
    assert use_cpu_moe_blocks(moe) == 1
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(2)).bfloat16()
    calls = count_calls(monkeypatch, moe.cpu_block, "run")
    got = moe(x)
    assert len(calls) == 1
    block, moe.cpu_block = moe.cpu_block, None
    want = moe(x)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    assert (got.float() - want.float()).abs().max() <= OUTPUT_TOL * want.float().abs().max()
    moe.cpu_block = block


def test_prefill_rows_keep_the_module_path(monkeypatch):
    moe = _moe(ROUTINGS["kimi"])
    use_cpu_moe_blocks(moe)
    calls = count_calls(monkeypatch, moe.cpu_block, "run")
    moe(torch.randn(MAX_ROWS + 1, HIDDEN).bfloat16())
    moe(torch.randn(3, HIDDEN))  # float32 rows: not the kernel's
    assert calls == []


def test_a_shared_expert_off_the_grid_keeps_the_module_path():
    moe = _moe(ROUTINGS["kimi"])
    moe.shared_experts.down_proj.method = DENSE  # as a layer the grid does not hold
    assert CpuMoEBlock.build(moe) is None
