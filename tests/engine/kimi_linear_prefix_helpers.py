"""What the Kimi Linear prefix-cache tests share: budgets in pages and snapshots, a cold
engine to compare with, and the accounting every test ends on.

Comparisons: a cached request starts its prompt's tail from a snapshot of the
recurrent state instead of from the first token, so its arithmetic differs from
a cold run only in summation order (the chunked delta rule from a state versus
over the whole prompt). Logits agree within FP32_ATOL (as in test_kimi_linear.py)
and greedy tokens up to the cold run's first close call (tests/engine/agreement.py).
"""

from __future__ import annotations

import torch

from engine import LLM, SamplingParams
from engine.requests.outputs import RequestOutput
from tests.engine.agreement import assert_outputs_agree

FP32_ATOL = 1e-4
PAGE = 16
# The tiny checkpoint (tests/engine/kimi_linear_checkpoints.py) in float32: two MLA
# layers of 16 + 8 latent values, and two KDA layers' states of 12,800 bytes together.
PAGE_BYTES = PAGE * 2 * 24 * 4
STATE_BYTES = 12_800
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2)


def tokens(n: int, seed: int) -> list[int]:
    """`n` random token ids from 2 (transformers' reference treats 0 as padding)."""
    return torch.randint(2, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def kv_gib(pages: int, seqs: int) -> float:
    """A KV budget that holds `seqs` running states, as many snapshots and `pages` pages
    (engine/kv/state_budget.py keeps snapshots within a quarter of what the running
    states leave: enough pages make that room)."""
    return ((2 * seqs) * STATE_BYTES + pages * PAGE_BYTES + 64) / 1024**3


def make_llm(path, **overrides) -> LLM:
    settings = dict(dtype="float32", kv_cache_dtype="auto", kv_memory=0.01)
    return LLM(str(path), **{**settings, **overrides})


def assert_like_cold(got: RequestOutput, cold: RequestOutput) -> None:
    """The same continuation as the cold run: the first token's logprobs within the bound,
    greedy tokens up to the cold run's first close call."""
    first, want = got.outputs[0].logprobs[0].top, cold.outputs[0].logprobs[0].top
    assert first.keys() == want.keys()
    assert all(abs(first[t] - want[t]) < FP32_ATOL for t in want), (first, want)
    assert assert_outputs_agree(got.outputs[0], cold.outputs[0], FP32_ATOL) > 0


def assert_states_accounted(llm: LLM) -> None:
    """With nothing running: every snapshot entry is free or held by a resident node of
    the tree, and every page is free or held once, by the tree."""
    engine = llm.engine
    cache, alloc = engine.prefix_cache, engine.allocator
    snapshots = cache.snapshots
    assert not engine.has_unfinished()
    assert snapshots.num_free + snapshots.num_held == snapshots.num_entries
    held = [node for node in cache._nodes() if node.snapshot is not None]
    assert len(held) == snapshots.num_held
    assert len({node.snapshot for node in held}) == len(held)
    assert alloc.num_free + cache.num_pages == alloc.num_pages
    assert engine.scheduler.state_slots.num_free == engine.scheduler.state_slots.num_slots
