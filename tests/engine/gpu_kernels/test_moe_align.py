"""moe_align: pairs sorted by expert into padded blocks (torch only; no Triton needed)."""

from __future__ import annotations

import pytest
import torch

from engine.gpu_kernels.moe_align import moe_align, moe_capacity


def check_layout(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> None:
    """Every routed pair exactly once, in its expert's blocks, in pair order; padding masked."""
    blocks = moe_align(topk_ids, num_experts, block_m)
    pairs = topk_ids.numel()
    flat = topk_ids.reshape(-1).tolist()
    ids = blocks.sorted_ids.tolist()
    experts = blocks.block_expert.tolist()
    assert blocks.num_pairs == pairs and blocks.top_k == topk_ids.shape[1]
    assert len(ids) == moe_capacity(pairs, num_experts, block_m) == len(experts) * block_m
    seen = []
    for b, e in enumerate(experts):
        rows = ids[b * block_m : (b + 1) * block_m]
        if e < 0:
            assert all(r == pairs for r in rows), "a block past the end holds pairs"
            continue
        real = [r for r in rows if r != pairs]
        assert all(flat[r] == e for r in real), (
            f"block {b} of expert {e} holds other experts' pairs"
        )
        # padding only at the end of an expert's last block
        assert rows[: len(real)] == real
        seen.extend(real)
    routed = [p for p, e in enumerate(flat) if 0 <= e < num_experts]
    assert sorted(seen) == routed, "some routed pair is missing or repeated"
    for e in range(num_experts):  # stable: an expert's pairs keep their order
        mine = [p for p in seen if flat[p] == e]
        assert mine == sorted(mine)
        count = sum(1 for x in flat if x == e)
        assert experts.count(e) == -(-count // block_m)  # no block for an expert without pairs
    valid = [e for e in experts if e >= 0]
    assert valid == sorted(valid) and experts[len(valid) :] == [-1] * (len(experts) - len(valid))


@pytest.mark.parametrize("tokens,top_k,experts,block_m", [(5, 2, 8, 16), (1, 8, 384, 16),
                                                          (40, 2, 4, 16), (37, 3, 6, 4)])  # fmt: skip
def test_random_routings(seed, tokens, top_k, experts, block_m):
    ids = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)])
    check_layout(ids, experts, block_m)


def test_skewed_routing_shared_sets_and_an_empty_expert():
    ids = torch.tensor(
        [[0, 1], [1, 0], [0, 1], [3, 0], [0, 1]], dtype=torch.int32
    )  # expert 2: none
    check_layout(ids, 4, 2)
    blocks = moe_align(ids, 4, 2)
    assert 2 not in blocks.block_expert.tolist()
    assert blocks.sorted_ids[:6].tolist() == [0, 3, 4, 7, 8, 10]  # expert 0, padded by 10


def test_ids_outside_the_experts_get_no_block():
    ids = torch.tensor([[0, -1], [5, 1], [-1, -1]])
    check_layout(ids, 4, 4)
    routed = set(moe_align(ids, 4, 4).sorted_ids.tolist()) - {ids.numel()}
    assert routed == {0, 3}


def test_empty_batch_and_bad_arguments():
    assert moe_align(torch.empty(0, 2, dtype=torch.int64), 8, 16).sorted_ids.numel() == 0
    with pytest.raises(ValueError, match="topk_ids must be"):
        moe_align(torch.zeros(4, dtype=torch.int64), 8, 16)
    with pytest.raises(ValueError, match="dtype torch.float32"):
        moe_align(torch.zeros(2, 2), 8, 16)
    with pytest.raises(ValueError, match="must be positive"):
        moe_align(torch.zeros(2, 2, dtype=torch.int64), 0, 16)
