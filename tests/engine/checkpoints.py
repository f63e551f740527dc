"""Tiny random checkpoints built with transformers' own classes, saved like real ones.

The builders live in `engine.devtools.testing` (other issues' tests and benchmarks use
them too); this module keeps the names tests import, plus the transformers
reference runs. Tests compare the engine against transformers'
implementation on these, so the reference is independent of the code under test.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.devtools.testing.chat_templates import CHATML_TEMPLATE
from engine.devtools.testing.checkpoints import save_model, tiny_glm4, tiny_llama, tiny_qwen2
from engine.devtools.testing.tokenizers import CORPUS
from engine.devtools.testing.tokenizers import save_bpe_tokenizer as save_tokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

__all__ = [
    "CHATML_TEMPLATE",
    "CORPUS",
    "SPECIAL_TOKENS",
    "assert_greedy_matches_reference",
    "reference_greedy",
    "reference_logits",
    "save_model",
    "save_tokenizer",
    "tiny_glm4",
    "tiny_llama",
    "tiny_qwen2",
]


def reference_logits(directory: Path, token_ids: list[int], dtype=torch.float32) -> torch.Tensor:
    """transformers' logits for one sequence: [len, vocab] float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype).eval()
    with torch.no_grad():
        out = model(torch.tensor([token_ids])).logits[0]
    return out.float()


def reference_greedy(directory: Path, token_ids: list[int], max_new: int, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([token_ids]),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(token_ids) :].tolist()


def assert_greedy_matches_reference(
    directory: Path, token_ids: list[int], got: list[int], tol: float, dtype=torch.float32
) -> int:
    """The engine's greedy continuation `got` against transformers' on the same model:
    equal up to transformers' first close call (a top-2 margin within 2 * tol, `tol`
    being how far the two implementations' logits may differ: tests/engine/agreement.py).
    Returns how many tokens were compared."""
    from tests.engine.agreement import assert_greedy_agrees, margins_of_logits

    expected = reference_greedy(directory, token_ids, len(got), dtype)
    # The logits that chose each expected token: its own sequence, teacher-forced.
    logits = reference_logits(directory, token_ids + expected, dtype)[len(token_ids) - 1 : -1]
    return assert_greedy_agrees(got, expected, margins_of_logits(logits), tol)
