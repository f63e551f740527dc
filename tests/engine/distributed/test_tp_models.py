"""Tensor-parallel models on 2 and 4 gloo ranks against the same model in one process.

Each family's split layers (column/row-parallel linears, vocab-parallel
embedding and head, GQA heads split with replicated KV heads at TP 4, MLA
heads split over a replicated latent, MoE experts split inside or dealt
whole, FP8 and INT4 checkpoints kept packed; DeepSeek V3.2's and GLM-5.x's
lightning indexer and its key cache replicated on every rank, so every rank
selects the same positions; Kimi Linear's KDA heads split like attention
heads, each rank keeping its heads' recurrent states) must give the logits of TP 1 up
to float32 summation order, and the same greedy tokens wherever that order cannot
decide them, with float32, BF16 and FP8 KV caches, in a batch of prompts of different lengths and on a
prefix-cache hit. Everything runs through `LLM(..., tensor_parallel_size=N)`:
rank 0 here, worker processes for the other ranks.
"""

from __future__ import annotations

import pytest

from engine.devtools.testing.checkpoints import (
    build_deepseek_v3,
    build_glm4_moe,
    make_checkpoint,
    tiny_glm4,
    tiny_llama,
)
from tests.engine.agreement import assert_outputs_agree
from tests.engine.distributed.tp_cases import run_case
from tests.engine.dsa_checkpoints import as_released_fp8, build_deepseek_v32, build_glm_moe_dsa
from tests.engine.kimi_linear_checkpoints import build_kimi_linear

# float32 weights and activations: the ranks sum the same products in another
# order (partial sums over heads / intermediate slices, then the all-reduce),
# which moves float32 logits by ~1e-6 on these models.
FLOAT32_LOGITS_ATOL = 1e-4
# BF16 / FP8 caches round K and V; a value that lands on the other side of a
# rounding boundary after the float32 reordering moves the logits more.
ROUNDED_KV_LOGITS_ATOL = 1e-2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    return {
        "llama": str(tiny_llama(root / "llama")),  # 4 heads, 2 KV heads
        "glm4": str(tiny_glm4(root / "glm4")),
        "glm4_moe": str(build_glm4_moe(root / "glm4_moe")),
        "kimi": str(build_deepseek_v3(root / "deepseek_v3")),
        "kimi_fp8": str(make_checkpoint("kimi_k2", root / "k_fp8", quantization="fp8_block").path),
        "glm4_moe_int4": str(
            make_checkpoint("glm4_moe", root / "g_int4", quantization="int4_experts").path
        ),
        # index_topk 8: in one batch, the 2-token prompt stays dense (8 positions with
        # its 6 generated), the others and the shared prefix (21) turn sparse.
        "glm5": str(build_glm_moe_dsa(root / "glm5")),
        "deepseek_v32": str(build_deepseek_v32(root / "deepseek_v32")),
        "glm5_fp8": str(as_released_fp8(build_glm_moe_dsa, root / "glm5_fp8")[0]),
        "kimi_linear": str(build_kimi_linear(root / "kimi_linear")),  # 4 KDA heads, 4 MLA heads
    }


# Models whose cached prefixes are not reused yet (a hybrid's prefix needs its state).
NO_PREFIX_REUSE = {"kimi_linear"}


CASES = {
    2: [
        ("llama", "bf16", False),
        ("glm4", "auto", False),
        ("glm4_moe", "auto", False),
        ("glm4_moe", "fp8_e4m3", True),
        ("kimi", "auto", False),
        ("kimi", "fp8_e4m3", True),
        ("kimi_fp8", "auto", False),
        ("glm4_moe_int4", "auto", True),
        ("glm5", "auto", False),
        ("glm5", "fp8_e4m3", True),
        ("deepseek_v32", "auto", False),
        ("glm5_fp8", "auto", False),
        ("kimi_linear", "auto", False),
        ("kimi_linear", "fp8_e4m3", True),
    ],
    # 4 query heads over 4 ranks; the 2 KV heads are replicated on 2 ranks each.
    4: [("llama", "auto", False), ("glm4_moe", "auto", True)],
}


@pytest.mark.parametrize(
    ("world", "case"),
    [(world, case) for world, cases in CASES.items() for case in cases],
    ids=lambda value: value if isinstance(value, int) else "-".join(map(str, value)),
)
def test_split_models_match_one_process(models, world, case):
    name, kv, expert_parallel = case
    one = run_case(models[name], kv, expert_parallel, 1)
    many = run_case(models[name], kv, expert_parallel, world)
    atol = FLOAT32_LOGITS_ATOL if kv == "auto" else ROUNDED_KV_LOGITS_ATOL
    diff = (many["logits"] - one["logits"]).abs().max().item()
    assert diff <= atol, f"logits differ by {diff}"
    # Greedy tokens: the same wherever a choice is decided by more than the logits can
    # move (a random tiny model has near-ties; which way one goes is rounding), and the
    # logprobs of the tokens compared within the tolerance.
    for got, want in zip(many["outputs"], one["outputs"], strict=True):
        compared = assert_outputs_agree(got, want, atol)
        pairs = zip(want.logprobs, got.logprobs, strict=True)
        lp = [b.logprob - a.logprob for a, b in pairs][:compared]
        assert all(abs(d) <= 2 * atol for d in lp), lp  # logits within atol: 2 atol
    assert_outputs_agree(many["cold"], one["cold"], atol)
    # The cached prefix is computed as it was stored, but the uncached tail is a
    # smaller matrix product, summed in another order.
    assert_outputs_agree(many["warm"], many["cold"], atol)
    assert many["warm_cached"] > 0 or name in NO_PREFIX_REUSE
    if one["state_bytes"] is not None:  # each rank holds its share of the KDA heads' states
        assert many["state_bytes"] * world == one["state_bytes"]
