"""A tiny GLM-5 (MLA with DeepSeek sparse attention) decoding on the Triton backend gives the
torch backend's greedy tokens: the indexer scored from paged keys, attention over the
selected slots, in the same decode steps (interpreted on CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine import LLM, SamplingParams  # noqa: E402
from tests.engine.dsa_checkpoints import INDEX_TOPK, build_glm_moe_dsa  # noqa: E402

LONG = torch.randint(2, 256, (30,), generator=torch.Generator().manual_seed(3)).tolist()
SHORT = LONG[:4]  # within index_topk for its first decode steps
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def glm_path(tmp_path_factory):
    return build_glm_moe_dsa(tmp_path_factory.mktemp("glm_dsa_triton") / "tiny")


def tokens(path, backend: str, kv: str) -> tuple[list[list[int]], LLM]:
    llm = LLM(str(path), dtype="float32", kv_cache_dtype=kv, attention_backend=backend,
              kv_memory=0.01, fp8_decode_dots=False)  # fmt: skip
    outputs = llm.generate([LONG, SHORT], GREEDY)
    return [o.outputs[0].token_ids for o in outputs], llm


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_sparse_decode_on_triton_gives_the_torch_tokens(glm_path, kv):
    """FP8 latents too: both backends store the same bytes (the write kernel rounds as
    torch's cast does), and the kernel widens them (fp8_decode_dots off) as torch does."""
    expected, _ = tokens(glm_path, "torch", kv)
    got, llm = tokens(glm_path, "triton", kv)
    backend = llm.engine.runner.backend
    assert backend.name == "triton" and len(LONG) > INDEX_TOPK
    # Every decode step of the two indexer layers (layer 1 shares layer 0's selection)
    # scored on pages; the three MLA layers attended in the kernel.
    assert backend.index_score_calls == 2 * (GREEDY.max_tokens - 1)
    assert backend.mla_decode_calls == 3 * (GREEDY.max_tokens - 1)
    assert got == expected
