"""The real default model (SmolLM2-135M-Instruct) against transformers.

`make test` pulls it first (`resident models pull`); without it these tests
skip with the command that fixes that.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.model_files.store import default_model_dir, is_complete
from tests.engine.agreement import assert_greedy_agrees, margins_of_logits

pytestmark = pytest.mark.skipif(
    not is_complete(default_model_dir()), reason="default model not pulled: resident models pull"
)

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain recursion in one sentence.",
]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(default_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = []
    for text in PROMPTS:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tokenizer.encode(rendered, add_special_tokens=False))
    outputs, logits = [], []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(
                torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None
            )
            continuation = out[0, len(ids) :].tolist()
            outputs.append(continuation)
            logits.append(model(torch.tensor([ids + continuation])).logits[0].float())
    return prompts, outputs, logits


# float32 rounding is 2^16 times finer than BF16's, whose whole effect on these logits
# is about 2 (tests/engine/test_cpu_layer_ops.py): another float32 summation order
# moves them by about 3e-5 (here they come out identical). 1e-3 leaves room.
FP32_LOGIT_TOL = 1e-3


def test_float32_greedy_equals_transformers(reference):
    """Logits within float32 reordering of transformers', teacher-forced on its greedy
    continuation, and the same greedy tokens wherever that cannot decide them."""
    prompts, expected, ref_logits = reference
    llm = LLM("smollm2-135m-instruct", dtype="float32", kv_cache_dtype="auto")
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    for ids, want, ref, tokens in zip(prompts, expected, ref_logits, got, strict=True):
        ours = llm.prompt_logits(ids + want)
        assert (ours - ref).abs().max() <= FP32_LOGIT_TOL
        deciding = ref[len(ids) - 1 : -1]  # the rows that chose each continuation token
        assert assert_greedy_agrees(tokens, want, margins_of_logits(deciding), FP32_LOGIT_TOL)
    assert "Paris" in llm.tokenizer.decode(got[0])


@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_reduced_precision_agreement(reference, kv, capsys):
    """BF16 weights with BF16 or FP8 KV: top-1 agreement with float32 transformers, reported."""
    prompts, outputs, ref_logits = reference
    llm = LLM("smollm2-135m-instruct", dtype="bfloat16", kv_cache_dtype=kv)
    agree, total = 0, 0
    for ids, continuation, ref in zip(prompts, outputs, ref_logits, strict=True):
        ours = llm.prompt_logits(ids + continuation)
        agree += int((ours.argmax(-1) == ref.argmax(-1)).sum())
        total += ref.shape[0]
    rate = agree / total
    with capsys.disabled():
        print(f"\n[default model] bf16 weights, {kv} KV: top-1 agreement with fp32 = {rate:.3f}")
    assert rate >= 0.9
