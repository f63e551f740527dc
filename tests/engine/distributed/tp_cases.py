"""What the tensor-parallel model tests run on each engine (TP 1 and TP N alike)."""

from __future__ import annotations

from engine import LLM, SamplingParams

PROMPTS = [[5, 9, 17, 33, 2, 60], [7, 8], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 11]]
SHARED_PREFIX = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19]


def run_case(model_dir: str, kv: str, expert_parallel: bool, tp: int) -> dict:
    """Greedy outputs (tokens, top-2 logprobs) for a batch of prompts, prefill logits, and
    a prefix-cache hit, through `LLM(..., tensor_parallel_size=tp)`."""
    with LLM(
        model_dir,
        dtype="float32",
        kv_cache_dtype=kv,
        kv_memory=0.01,
        tensor_parallel_size=tp,
        expert_parallel=expert_parallel and tp > 1,
    ) as llm:
        # Top-2 logprobs: each greedy choice's margin (tests/engine/agreement.py).
        greedy = SamplingParams(max_tokens=6, temperature=0, logprobs=2, ignore_eos=True)
        batch = llm.generate(PROMPTS, greedy)
        logits = llm.prompt_logits(PROMPTS[2])
        cold = llm.generate([SHARED_PREFIX + [7]], greedy)[0]
        warm = llm.generate([SHARED_PREFIX + [7]], greedy)[0]
        return {
            "outputs": [out.outputs[0] for out in batch],
            "logits": logits,
            "cold": cold.outputs[0],
            "warm": warm.outputs[0],
            "warm_cached": warm.num_cached_tokens,
            "methods": llm.stats().get("linear_methods"),
            "state_bytes": llm.stats().get("recurrent_state_bytes"),  # hybrid models
        }
