"""Comparing the greedy tokens of two computations that are not the same arithmetic.

Two implementations of a model (the engine and transformers, TP 1 and TP 2, two
kernels) that sum in another order, or round in another place, give logits that
differ by up to some tolerance `tol`, which the tests assert on logits directly.
Greedy tokens then agree wherever the choice is decided by more than the
difference can move it: where the reference's top-2 margin exceeds 2 * tol. At a
closer call rounding decides, and whatever follows it continues a different
prefix, so tokens are compared only up to the first such position. Exactness
between the two would be luck; this is what the arithmetic defines.
"""

from __future__ import annotations

import torch

from engine.requests.outputs import CompletionOutput


def margins_of_logits(logits: torch.Tensor) -> list[float]:
    """Top-1 minus top-2 logit at each row of [positions, vocab]."""
    top2 = logits.float().topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


def margins_of_output(output: CompletionOutput) -> list[float]:
    """Top-1 minus top-2 logprob (the same as the logits' margin) of each generated token;
    the request must have asked for logprobs >= 2."""
    margins = []
    for info in output.logprobs or []:
        values = sorted(info.top.values(), reverse=True)
        assert len(values) >= 2, "ask for logprobs=2 (or more) to know each choice's margin"
        margins.append(values[0] - values[1])
    assert len(margins) == len(output.token_ids), "the reference has no logprobs"
    return margins


def decided(margins: list[float], tol: float) -> int:
    """How many leading positions are decided: margin above 2 * tol."""
    for position, margin in enumerate(margins):
        if margin <= 2 * tol:
            return position
    return len(margins)


def assert_greedy_agrees(got: list[int], want: list[int], margins: list[float], tol: float) -> int:
    """`got` equals the reference `want` up to its first close call (`margins`: the
    reference's top-2 margin at each of its tokens); returns how many were compared."""
    assert len(got) == len(want)
    count = decided(margins, tol)
    assert got[:count] == want[:count], (
        f"greedy tokens part before the first close call (position {count}): "
        f"{got[:count]} != {want[:count]}"
    )
    return count


def assert_outputs_agree(got: CompletionOutput, want: CompletionOutput, tol: float) -> int:
    """The same for two engine outputs; `want` carries top-2 logprobs."""
    return assert_greedy_agrees(got.token_ids, want.token_ids, margins_of_output(want), tol)


def teacher_forced(llm, sequences: list[list[int]], decoded: int) -> torch.Tensor:
    """float32 logits at every position of each sequence, the last `decoded` tokens run as
    decode steps (one row each, as generation runs them) after one prefill of the rest;
    concatenated [positions, vocab]. The prefix cache is emptied first, so every
    position is computed by the model as it is now."""
    if llm.engine.prefix_cache is not None:
        llm.engine.prefix_cache.clear()
    return torch.cat([llm.prompt_logits(s, decode_last=decoded).float() for s in sequences])


# Prompts for comparing two BF16 evaluations of the default model: eight prompts of
# DEFAULT_MODEL_GENERATED generated tokens are about 250 positions, so the RMS error of
# an evaluation over them is known to a few percent (per prompt it varies by about
# +-20%, over all of them by about +-5%).
DEFAULT_MODEL_PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "def add(a, b):",
    "import numpy as np\n",
    "The quick brown fox",
    "1, 2, 3, 4,",
]
DEFAULT_MODEL_GENERATED = 24
# Of those positions, the last few of each sequence are teacher-forced as decode steps
# (one row each, the decode path) and the rest in one prefill: eight prompts give 64
# decode rows, each a whole run of the model, so more would cost the suite minutes.
DEFAULT_MODEL_DECODED = 8


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).double().pow(2).mean().sqrt())


# Two equally accurate BF16 evaluations of one float32 function have RMS errors against
# it that agree within their sampling spread: over about 250 positions of the default
# model (eight prompts of 24 tokens) one came to 0.96-1.04 of the other's in every set
# of prompts tried. 25% is several times that spread.
BF16_RMS_RATIO = 1.25


def assert_bf16_evaluations_agree(
    got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor, rms_ratio: float = BF16_RMS_RATIO
) -> dict:
    """`got` and `want` [positions, vocab]: the logits of two BF16 evaluations of one model
    that round the same quantities to BF16 in other orders or places; `exact`: the float32
    model's on the same tokens. Greedy tokens of two such evaluations may part at a
    near-tie; what is defined is checked instead:

    - B, the largest distance of `want` from `exact`: what BF16 arithmetic costs this model
      on these positions, on this processor.
    - Each evaluation is within about B of the float32 one, so they are within 2B of each
      other (triangle inequality) at every position.
    - `got` is as accurate as `want`: its RMS error against float32 is within
      `rms_ratio` of `want`'s.
    - Where `want`'s top-2 margin exceeds 4B (twice the bound between the two) the
      greedy token is decided by the arithmetic, not by rounding: they agree.

    Returns the measures, for the test's report."""
    bound = float((want - exact).abs().amax())
    apart = (got - want).abs().amax(-1)
    got_error, want_error = _rms(got, exact), _rms(want, exact)
    assert (apart <= 2 * bound).all(), f"{float(apart.max()):.3f} apart; B = {bound:.3f}"
    assert got_error <= rms_ratio * want_error, (
        f"RMS error against float32 {got_error:.4f}, the reference's {want_error:.4f}"
    )
    top2 = want.topk(2, dim=-1).values
    decided_rows = top2[:, 0] - top2[:, 1] > 4 * bound
    assert torch.equal(got[decided_rows].argmax(-1), want[decided_rows].argmax(-1))
    return {
        "bound": bound,
        "apart": float(apart.max()),
        "rms": (got_error, want_error),
        "decided": int(decided_rows.sum()),
    }
