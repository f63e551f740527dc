"""A MoE layer's routed experts in one C call (engine/layers/cpu_moe_experts.py) against
the per-expert loop it replaces (SparseMoE.run_experts).

Tolerances, from the arithmetic. Both paths compute the same gate/up products,
SwiGLU and int8 activations (rounded to BF16 at the same points) and the same
float32 down-product values y_s for each (token, slot) s. They differ after:
- the kernel sums w_s * y_s in float32 and rounds once: within u |exact| of the
  exact sum (u = 2^-8, BF16's unit roundoff), plus float32 summation error,
  below k 2^-23 A with A = sum |w_s y_s|;
- the loop rounds y_s, then w_s * y_s, then each of its k additions to BF16:
  within (k + 1) u A (plus u^2 terms) of the exact sum.
So the kernel is held to u |exact| + k 2^-23 A against the exact sum, and to
(k + 2.1) u A against the loop.
"""

from __future__ import annotations

import pytest
import torch

from engine.cpu_kernels import library
from engine.devtools.testing.realistic_checkpoints import q4_1_values, q8_0_values
from engine.layers.cpu_grid_weights import grid_weight_of, pack_grid_weights
from engine.layers.cpu_matrix_path import use_matrix_path
from engine.layers.cpu_moe_block import CpuMoEBlock
from engine.layers.cpu_moe_experts import CpuMoeExperts
from engine.layers.layer_ops import CPU_LAYER_OPS
from engine.layers.linear_methods import DENSE
from engine.layers.moe import SparseMoE
from engine.layers.moe_routing import RoutingConfig
from engine.models.decoder import GatedMLP
from tests.engine.conftest import count_calls

pytestmark = pytest.mark.skipif(
    bool(library.unavailable()), reason=f"CPU kernels: {library.unavailable()}"
)
U = 2.0**-8  # BF16's unit roundoff
HIDDEN, INTERMEDIATE, EXPERTS = 128, 64, 16
# Logits (about +-3.5 on the tiny models, BF16 steps of 2^-6 there) of the two paths:
# the MoE output's roundings move them by one or two BF16 steps (measured up to 0.032).
LOGIT_TOL = 0.05


def _moe(top_k: int, gate_up_grid=q4_1_values, down_grid=q4_1_values, seed: int = 0):
    """A SparseMoE of grid-packed BF16 experts, as the engine leaves one after loading."""
    gen = torch.Generator().manual_seed(seed)
    routing = RoutingConfig(num_experts=EXPERTS, top_k=top_k, correction_bias=False)

    def expert(_: int) -> GatedMLP:
        mlp = GatedMLP(HIDDEN, INTERMEDIATE, reduce=False)
        with torch.no_grad():
            for linear, grid in ((mlp.gate_up_proj, gate_up_grid), (mlp.down_proj, down_grid)):
                linear.weight.copy_(grid(torch.randn(linear.weight.shape, generator=gen) * 0.1))
        mlp.ops = CPU_LAYER_OPS
        return mlp

    moe = SparseMoE(HIDDEN, routing, expert)
    pack_grid_weights(moe, "int8")
    return moe.bfloat16()


def _routes(tokens: int, top_k: int, gen: torch.Generator):
    """Expert 0 on every token (many), expert 14 on token 0 only (one), 15 on none."""
    ids = torch.empty(tokens, top_k, dtype=torch.int64)
    for t in range(tokens):
        others = torch.randperm(EXPERTS - 3, generator=gen)[: top_k - 1] + 1
        if t == 0:
            others[0] = EXPERTS - 2
        ids[t] = torch.cat([torch.zeros(1, dtype=torch.int64), others])
    weights = torch.rand(tokens, top_k, generator=gen) * 2.5 / top_k
    return weights, ids


def _exact(moe: SparseMoE, x, weights, ids) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of w_s y_s in float64, A = sum |w_s y_s|) per token and column, from the
    module's own products with a float32 down product."""
    exact = torch.zeros(x.shape, dtype=torch.float64)
    magnitude = torch.zeros_like(exact)
    for t in range(x.shape[0]):
        for weight, expert_id in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            mlp = moe.experts[expert_id]
            act = mlp.ops.silu_mul(mlp.gate_up_proj(x[t : t + 1]))
            y = grid_weight_of(mlp.down_proj).matmul(act, torch.float32)[0].double()
            exact[t] += weight * y
            magnitude[t] += (weight * y).abs()
    return exact, magnitude


@pytest.mark.parametrize("tokens", [1, 3, 16])
@pytest.mark.parametrize("top_k", [2, 8])
@pytest.mark.parametrize("grids", ["q4_1", "q8_0 gate_up"])
def test_the_kernel_sums_the_experts_as_the_loop_does(tokens, top_k, grids):
    gate_up_grid = q8_0_values if grids == "q8_0 gate_up" else q4_1_values
    moe = _moe(top_k, gate_up_grid)
    fused = CpuMoeExperts.build(moe)
    assert fused is not None and fused.gate_up_format == (8 if grids == "q8_0 gate_up" else 4)
    gen = torch.Generator().manual_seed(tokens * 10 + top_k)
    x = torch.randn(tokens, HIDDEN, generator=gen).bfloat16()
    weights, ids = _routes(tokens, top_k, gen)
    got = fused.run(x, weights, ids).double()
    loop = moe.run_experts(x, weights, ids).double()
    exact, magnitude = _exact(moe, x, weights, ids)
    assert (got - exact).abs().le(U * exact.abs() + top_k * 2.0**-23 * magnitude + 1e-30).all()
    assert (got - loop).abs().le((top_k + 2.1) * U * magnitude + 1e-30).all()
    # Rounding once is closer to the exact sum than rounding each summand.
    assert (got - exact).abs().mean() <= (loop - exact).abs().mean()


def test_only_grid_packed_bias_free_experts_of_one_shape_are_fused():
    moe = _moe(2)
    assert CpuMoeExperts.build(moe) is not None
    moe.local = [True] * (EXPERTS - 1) + [False]  # expert parallel: another rank holds one
    assert CpuMoeExperts.build(moe) is None
    moe = _moe(2)
    moe.experts[-1].down_proj.method = DENSE
    assert CpuMoeExperts.build(moe) is None
    moe = _moe(2)
    grid_weight_of(moe.experts[3].gate_up_proj).bias = torch.zeros(2 * INTERMEDIATE)
    assert CpuMoeExperts.build(moe) is None
    moe = _moe(2, down_grid=q8_0_values)
    grid_weight_of(moe.experts[5].down_proj).bits = 4  # experts of two widths
    assert CpuMoeExperts.build(moe) is None


def test_many_tokens_on_one_expert_stay_with_the_loop_where_it_would_use_bf16_tiles():
    fused = CpuMoeExperts.build(_moe(2))
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(16, HIDDEN, generator=gen).bfloat16()
    _, ids = _routes(16, 2, gen)  # expert 0 takes all 16 tokens
    assert fused.takes(x, ids)
    with use_matrix_path("bf16", min_rows=16):
        assert not fused.takes(x, ids)
        assert fused.takes(x[:15], ids[:15])
    assert not fused.takes(x.float(), ids)


def _on_q4_1_grid(src, dst):
    """The checkpoint with every 2-D linear weight (K % 32 == 0) rounded onto the Q4_1 grid,
    saved as float32: what the engine packs as grid weights."""
    from engine.devtools.testing.layouts import copy_checkpoint, read_tensors

    tensors = read_tensors(src)
    for name, tensor in tensors.items():
        if tensor.dim() == 2 and tensor.shape[1] % 32 == 0 and "embed_tokens" not in name:
            tensors[name] = q4_1_values(tensor)
        else:
            tensors[name] = tensor.float()
    return copy_checkpoint(src, dst, tensors)


@pytest.mark.parametrize("family", ["glm4_moe", "kimi_k2"])
def test_a_model_decodes_the_same_with_the_fused_experts_on_and_off(family, tmp_path, monkeypatch):
    """Greedy tokens over 16 steps are equal, except where the two paths' roundings can
    flip a near-tie: the logits, teacher-forced on the fused run's tokens, agree within
    LOGIT_TOL, so a token may differ only where the top two are within 2 LOGIT_TOL (the
    first difference ends the comparison: the contexts part there). The tiny random
    models' next-token distributions are flat (top-two gaps of 0.003 occur), so exact
    equality of every token would be luck."""
    from engine import LLM, SamplingParams
    from engine.devtools.testing.checkpoints import make_checkpoint

    tiny = make_checkpoint(family, tmp_path / "float")
    path = _on_q4_1_grid(tiny.path, tmp_path / "grid")
    llm = LLM(str(path), dtype="bfloat16", kv_cache_dtype="bf16", kv_memory=0.01)
    llm.engine.model.model.decode_step = None  # the modules (the fused step: its own test)
    blocks = [m for m in llm.engine.model.modules() if isinstance(m, SparseMoE)]
    assert blocks and all(b.cpu_experts is not None for b in blocks)
    calls = count_calls(monkeypatch, CpuMoeExperts, "run")  # prefill
    calls_as_layer = count_calls(monkeypatch, CpuMoEBlock, "run")  # decode steps, the layer whole
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 250, (n,), generator=gen).tolist() for n in (12, 30, 45)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=2)
    fused = [o.outputs[0] for o in llm.generate(prompts, params)]
    assert calls and len(calls) + len(calls_as_layer) >= 16 * len(blocks)  # every step
    sequences = [p + o.token_ids for p, o in zip(prompts, fused, strict=True)]
    # Prefill the prompt, decode the 16 generated tokens: both kinds of step.
    fused_logits = [llm.prompt_logits(s, decode_last=16) for s in sequences]
    for block in blocks:
        block.cpu_experts = block.cpu_block = None
    llm.engine.prefix_cache.clear()  # recompute the prompts too
    loop = [o.outputs[0] for o in llm.generate(prompts, params)]
    loop_logits = [llm.prompt_logits(s, decode_last=16) for s in sequences]
    for a, b in zip(fused_logits, loop_logits, strict=True):
        assert (a.float() - b.float()).abs().max() <= LOGIT_TOL
    for a, b in zip(fused, loop, strict=True):
        for step, (mine, theirs) in enumerate(zip(a.token_ids, b.token_ids, strict=True)):
            if mine != theirs:
                first, second = sorted(a.logprobs[step].top.values(), reverse=True)[:2]
                assert first - second <= 2 * LOGIT_TOL, (step, first, second)
                break


@pytest.mark.parametrize("tokens", [3, 16])
def test_the_result_does_not_depend_on_the_thread_count(tokens):
    """Threads take runs of the gate/up items split at equal cost and runs of the output
    tiles; each token's sum still runs over its experts in order, so 1, 2 or 3 threads give
    the same bits, including where the experts' token counts differ (expert 0 has all)."""
    moe = _moe(8, q4_1_values)
    fused = CpuMoeExperts.build(moe)
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, HIDDEN, generator=gen).bfloat16()
    weights, ids = _routes(tokens, 8, gen)
    previous = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(fused.run(x, weights, ids))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
