"""DeepSeek sparse attention's decode kernels against torch, for bench/gpu_check.py.

GLM-5's indexer (32 heads of 128, top-2048) over the correctness part's
contexts (`check_lens`) and its MLA latent (`mla`): the Triton backend's
indexer scores from the paged keys against sparse_mla.index_scores over the
gathered keys, and sparse MLA decode (the kernel over each sequence's
selected slots, read as one-token pages) against the torch sparse path on the
same selection. The top-k is smaller than a quarter of the longest context, so
the tiny `--smoke` shapes select too.
"""

from __future__ import annotations

import torch

from bench.gpu_check_correctness import check, fill_random_, guarded, random_slots, rel_err
from engine.attention.metadata import AttentionMetadata
from engine.attention.mla import MLADims
from engine.attention.sparse_mla import (
    index_scores,
    paged_decode_selection,
    select_top_k,
    sparse_mla_attention,
)
from engine.kv.dsa_layout import DSALayout
from engine.kv.pools import make_pool

INDEX_HEADS, INDEX_DIM, INDEX_TOPK = 32, 128, 2048  # GLM-5's config.json


def _pools(cfg, device, kv: str, num_pages: int):
    _, lora, rope = cfg["mla"]
    layout = DSALayout(num_layers=1, kind="mla", latent_dim=lora + rope, rope_dim=rope,
                       index_dim=INDEX_DIM, index_layers=(0,))  # fmt: skip
    pools = [make_pool(layout, num_pages, cfg["page"], kv, device) for _ in range(2)]
    fill_random_(pools[0].storage, 1 / 16)
    pools[0].index_storage.normal_()
    for pool in pools:
        if pool.is_fp8:
            pool.set_scales(torch.tensor([1 / 16]), torch.tensor([1 / 8]), "check")
    pools[1].storage.copy_(pools[0].storage)
    pools[1].index_storage.copy_(pools[0].index_storage)
    return pools


def _dsa_case(cfg, device, heads: int, kv: str) -> dict:
    from engine.attention.triton.backend import TritonAttentionBackend

    _, lora, rope = cfg["mla"]
    lens, page = cfg["check_lens"], cfg["page"]
    topk = min(INDEX_TOPK, max(lens) // 4)
    num_pages = sum(-(-n // page) for n in lens) + 1
    pools = _pools(cfg, device, kv, num_pages)
    slots = random_slots(lens, page, num_pages)
    # The new tokens' slots hold their rows already: the writes rewrite the same values.
    last = torch.stack([s[-1] for s in slots]).to(device)
    meta = AttentionMetadata.build([1] * len(lens), lens, last, slots, device)
    b, bf = len(lens), dict(device=device, dtype=torch.bfloat16)
    queries = torch.randn(b, 1, INDEX_HEADS, INDEX_DIM, **bf)
    weights = torch.randn(b, 1, INDEX_HEADS, device=device) * INDEX_HEADS**-0.5
    backend = TritonAttentionBackend()
    backend.fp8_dot = False  # the widening path, which computes as torch does
    scale = INDEX_DIM**-0.5
    got = backend.index_scores(0, queries[:, 0], weights[:, 0], pools[1], meta, scale)
    keys = pools[0].gather_index_keys(0, meta.context_slots)
    visible = torch.arange(max(lens), device=device)[None, :] < torch.tensor(lens, device=device)[:, None]  # fmt: skip
    score_err = max(
        rel_err(
            got[row, :n],
            index_scores(
                queries[row : row + 1], weights[row : row + 1], keys[row : row + 1, :n], scale
            )[0, 0],
        )  # fmt: skip
        for row, n in enumerate(lens)
    )
    hidden_ok = bool(torch.isneginf(got[~visible]).all())
    selection = paged_decode_selection(0, queries, weights, pools[1], meta, topk, scale, backend)
    reference_selection = select_top_k(queries, weights, keys, meta, topk, scale)
    same = sum(
        len(
            set(selection.meta.context_slots[r, :n].tolist())
            & set(reference_selection.meta.context_slots[r, :n].tolist())
        )  # fmt: skip
        for r, n in enumerate(selection.meta.context_lens)
    )
    dims = MLADims(num_heads=heads, nope_dim=128, rope_dim=rope, v_dim=128, lora_rank=lora)
    old_rows = pools[0].storage[0][last]
    mla_args = (
        torch.randn(b, heads, 128, **bf),
        torch.randn(b, heads, rope, **bf),
        *_stored_values(pools[0], old_rows, lora, bf),
        torch.randn(heads * 256, lora, **bf) * lora**-0.5,
    )
    selections = [selection]
    ref = sparse_mla_attention(0, *mla_args[:4], mla_args[4], pools[0], meta, dims, 0.07,
                               selections)  # fmt: skip
    out = sparse_mla_attention(0, *mla_args[:4], mla_args[4], pools[1], meta, dims, 0.07,
                               selections, backend=backend)  # fmt: skip
    res = check(f"dsa decode {kv} {heads}h top-{topk}", rel_err(out, ref))
    res["score_rel_err"] = score_err
    res["selection_agreement"] = same / sum(selection.meta.context_lens)
    # Scores twice (the comparison above, then the selection's), decode once.
    res["kernels_used"] = backend.index_score_calls == 2 and backend.mla_decode_calls == 1
    res["ok"] = res["ok"] and score_err <= res["tol"] and hidden_ok and res["kernels_used"]
    return res


def _stored_values(pool, rows: torch.Tensor, lora: int, bf: dict) -> tuple:
    """The latent and rope key each new token's slot already stores, as activations: the
    step's writes (torch's and the kernel's) then store the same bytes again, exactly,
    whatever the interpreter's FP8 cast does (DESIGN.md §3)."""
    if pool.is_fp8:
        values = rows.view(torch.float8_e4m3fn).float()
        return (values[:, :lora] / 16).to(**bf), (values[:, lora:] / 8).to(**bf)
    return rows[:, :lora].to(**bf), rows[:, lora:].to(**bf)


def dsa_checks(cfg, device) -> list[dict]:
    results = []
    heads = max(cfg["mla_check_heads"])
    for kv in ("fp8_e4m3", "bf16"):
        name = f"dsa decode {kv} {heads}h"
        results.append(guarded(name, _dsa_case, cfg, device, heads, kv))
    return results
