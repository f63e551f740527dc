"""Comparing a sparse-attention model (DSA) with transformers where rounding moves its choices.

A DSA query attends to its top-k positions only, so a rounding that moves one
score across the top-k boundary swaps a position in or out, and that row's
logits move by up to a few units on the tiny random checkpoints (transformers'
own BF16 run of DeepSeek V3.2's fixture does so against its float32 run: p90
of the per-row max |diff| 1.05). Where the selections agree, what is left is
the ordinary cost of the rounding, which the MoE bounds of
tests/engine/moe_checkpoints.py state. So the quantized runs are compared row
by row where every layer selected the same positions as transformers did.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

import engine.models.dsa_indexer as dsa_indexer
from tests.engine.moe_checkpoints import assert_within_quantized_bounds


def reference_run(directory: Path, tokens: list[int], dtype=torch.float32):
    """transformers' logits [S, vocab] (float32) and each full layer's selection [S, S]
    (True where a query attends: its top-k, within the causal limit)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype).eval()
    chosen = []
    for name, module in model.named_modules():
        if name.endswith("self_attn.indexer"):
            module.register_forward_hook(lambda _m, _a, out: chosen.append(out[0].long()))
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    n = len(tokens)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    masks = [torch.zeros(n, n, dtype=torch.bool).scatter_(-1, c, True) & causal for c in chosen]
    return logits, masks


@contextmanager
def recorded_selections():
    """Within the block, every prefill selection the engine makes ([Q, L] masks, in
    layer order) is appended to the list it yields."""
    masks: list[torch.Tensor] = []
    original = dsa_indexer.select_top_k

    def record(*args):
        selection = original(*args)
        if selection.mask is not None:
            masks.append(selection.mask[0, 0].clone())
        return selection

    dsa_indexer.select_top_k = record
    try:
        yield masks
    finally:
        dsa_indexer.select_top_k = original


def engine_run(llm, tokens: list[int]):
    """The engine's logits for one prefill of `tokens` and its selections."""
    with recorded_selections() as masks:
        logits = llm.prompt_logits(tokens)
    return logits, masks


def chunked_engine_run(llm, tokens: list[int], chunk_size: int, full_layers: int):
    """engine_run with the prompt prefilled `chunk_size` tokens a step: each of the
    `full_layers` indexer layers' chunk masks stitched into one [S, S] selection, as one
    prefill would give it. A chunk whose queries see at most top-k positions records no
    mask (it attends to everything visible), so its rows stay causal."""
    with recorded_selections() as masks:
        logits = llm.prompt_logits(tokens, chunk_size=chunk_size)
    n = len(tokens)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    stitched = [causal.clone() for _ in range(full_layers)]
    for i, part in enumerate(masks):  # in layer order within each chunk
        queries, context = part.shape  # the chunk's rows end at its context length
        stitched[i % full_layers][context - queries : context, :context] = part
    return logits, stitched


def assert_within_bounds_where_selection_agrees(
    got, got_masks, expected, expected_masks, fp8: bool, topk: int
) -> int:
    """The MoE bounds over the rows whose selections all equal the reference's; enough
    of them past the dense first `topk` rows that the check is not empty. Returns how
    many rows were compared."""
    assert len(got_masks) == len(expected_masks)
    same = torch.stack(
        [(a == b).all(-1) for a, b in zip(got_masks, expected_masks, strict=True)]
    ).all(0)
    sparse_rows = same[topk:]
    assert int(sparse_rows.sum()) >= len(sparse_rows) // 4, f"selections agree on {same.tolist()}"
    assert_within_quantized_bounds(got[same], expected[same], fp8=fp8)
    return int(same.sum())
