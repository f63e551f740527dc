"""End-to-end decode tokens/s for bench/gpu_check.py: mid-size random GLM-MoE and Kimi models.

Each model is built once with transformers' own classes (random weights, the
engine's tokenizer fixtures), saved to a temporary folder and served by the
engine with the Triton backend (FP8 and BF16 KV; decode replayed as CUDA
graphs, the default, and FP8 once more with them off) and the torch backend
(FP8 KV) for comparison. Decode tokens/s = batch * (n - 1) / (time for n
tokens - time for 1 token): prefill cancels out. A graph run's greedy tokens
are compared with the eager run's of the same model and KV dtype (the same
kernels and split grids, so they should be equal). Failures are reported per
run, never raised, so the kernel results of the check stand on their own.
"""

from __future__ import annotations

import gc
import tempfile
import time
from pathlib import Path

import torch

# (attention backend, KV dtype, CUDA graphs)
RUNS = (
    ("triton", "fp8_e4m3", False),
    ("triton", "fp8_e4m3", True),
    ("triton", "bf16", True),
    ("torch", "fp8_e4m3", False),
)


def _free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Mid-size models for the GPU run (~0.6B parameters each, BF16) and tiny ones for the smoke run.
SIZES = {
    "full": dict(hidden=2048, ffn=5632, moe_ffn=512, layers=8, experts=16, topk=4, heads=32,
                 kv_heads=8, head_dim=128, q_lora=768, kv_lora=512, nope=128, rope=64, v=128),
    "smoke": dict(hidden=64, ffn=128, moe_ffn=32, layers=2, experts=8, topk=2, heads=4,
                  kv_heads=2, head_dim=16, q_lora=32, kv_lora=32, nope=16, rope=16, v=16),
}  # fmt: skip


def build_model(family: str, folder: Path, size: dict, max_positions: int) -> Path:
    """A random checkpoint (transformers' classes, the engine's tokenizer fixtures), BF16."""
    from engine.devtools.testing.checkpoints import DEEPSEEK_V3, GLM4_MOE, save_model
    from engine.devtools.testing.tokenizers import (
        GLM_VOCAB_SIZE,
        KIMI_VOCAB_SIZE,
        save_glm_tokenizer,
        save_kimi_tokenizer,
    )

    common = dict(
        hidden_size=size["hidden"],
        intermediate_size=size["ffn"],
        moe_intermediate_size=size["moe_ffn"],
        num_hidden_layers=size["layers"],
        n_routed_experts=size["experts"],
        num_experts_per_tok=size["topk"],
        num_attention_heads=size["heads"],
        max_position_embeddings=max_positions,
        initializer_range=0.02,
    )
    if family == "glm4_moe":
        from transformers import Glm4MoeConfig as Config
        from transformers import Glm4MoeForCausalLM as Model

        params = {**GLM4_MOE, **common, "vocab_size": GLM_VOCAB_SIZE}
        params.update(num_key_value_heads=size["kv_heads"], head_dim=size["head_dim"])
        tokenizer = save_glm_tokenizer
    else:
        from transformers import DeepseekV3Config as Config
        from transformers import DeepseekV3ForCausalLM as Model

        params = {**DEEPSEEK_V3, **common, "vocab_size": KIMI_VOCAB_SIZE}
        params.update(
            num_key_value_heads=size["heads"],
            q_lora_rank=size["q_lora"],
            kv_lora_rank=size["kv_lora"],
            qk_nope_head_dim=size["nope"],
            qk_rope_head_dim=size["rope"],
            v_head_dim=size["v"],
            rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        )
        tokenizer = save_kimi_tokenizer
    torch.manual_seed(0)
    model = Model(Config(**params)).to(torch.bfloat16).eval()
    return save_model(model, folder, shard_size="4GB", tokenizer=tokenizer)


def _decode_rate(llm, prompts: list[list[int]], n: int, device) -> dict:
    """Warm up (compiles every kernel at these shapes), then time 1 and n + 1 tokens."""
    from engine import SamplingParams

    llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    spent = []
    for tokens in (1, n + 1):
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        _sync(device)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        _sync(device)
        spent.append(time.perf_counter() - start)
    rate = len(prompts) * n / max(spent[1] - spent[0], 1e-9)
    calls = getattr(llm.engine.runner.backend, "mla_decode_calls", None)
    graphs = llm.engine.runner.graphs
    return {
        "prefill_s": spent[0],
        "decode_tok_s": rate,
        "mla_kernel_calls": calls,
        "graph_steps": graphs.replays if graphs is not None else 0,
        "graph_off": graphs.disabled if graphs is not None else "not set up",
        "tokens": [o.outputs[0].token_ids for o in outputs],
    }


def _compare_tokens(rows: list[dict]) -> None:
    """Mark each graph run with whether its tokens equal the eager run's (same model, KV)."""
    eager = {(r["model"], r["kv"]): r["tokens"] for r in rows if "tokens" in r and not r["graphs"]}
    for row in rows:
        key = (row["model"], row["kv"])
        if row.get("graphs") and "tokens" in row and key in eager:
            same = sum(a == b for a, b in zip(row["tokens"], eager[key], strict=True))
            row["tokens_equal_to_eager"] = f"{same}/{len(eager[key])} sequences"
    for row in rows:
        row.pop("tokens", None)


def run_e2e(cfg, device, deadline: float, mode: str = "full") -> list[dict]:
    """One row per (model, backend, KV dtype); no run starts after `deadline` (monotonic)."""
    from engine import LLM

    rows = []
    batch, plen, n = cfg["e2e_batch"], cfg["e2e_prompt"], cfg["e2e_tokens"]
    prompts = [torch.randint(10, 300, (plen,)).tolist() for _ in range(batch)]
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("glm4_moe", "kimi"):
            try:
                path = build_model(family, Path(tmp) / family, SIZES[mode], 2 * (plen + n) + 64)
            except Exception as err:  # report and go on: the kernel results stand alone
                rows.append({"model": family, "error": f"build: {err!r}"[:300]})
                continue
            for backend, kv, graphs in cfg.get("e2e_runs", RUNS):
                row = {"model": family, "backend": backend, "kv": kv, "graphs": graphs}
                if time.monotonic() > deadline:
                    rows.append({**row, "error": "skipped: time budget"})
                    continue
                llm = None
                try:
                    llm = LLM(
                        str(path),
                        dtype="bfloat16",
                        kv_cache_dtype=kv,
                        attention_backend=backend,
                        enable_prefix_caching=False,
                        max_num_seqs=batch,
                        max_model_len=plen + n + 16,
                        kv_memory=8.0 if device.type == "cuda" else 0.05,
                        cuda_graphs=graphs,
                    )
                    row.update(_decode_rate(llm, prompts, n, device))
                except Exception as err:
                    row["error"] = repr(err)[:300]
                rows.append(row)
                llm = None
                _free(device)
    _compare_tokens(rows)
    return rows
