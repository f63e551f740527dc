"""Dense weights quantized at load (`cpu_weights`): llama.cpp's grids, then packed exactly."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType, quants

from engine import LLM
from engine.cpu_kernels.library import unavailable
from engine.devtools.testing.checkpoints import make_checkpoint
from engine.devtools.testing.realistic_checkpoints import put_on_grid
from engine.layers.cpu_grid_weights import grid_weight_of
from engine.weights.grid_rounding import GRIDS

PROMPT = torch.randint(3, 256, (24,), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.mark.parametrize("grid", list(GRIDS))
def test_the_grids_round_as_llama_cpps_quantizers_do(grid):
    """gguf's own quantize-then-dequantize is the reference, bit for bit."""
    weight = torch.randn(48, 256, generator=torch.Generator().manual_seed(1)) * 0.05
    weight[0, :32] = 0.0  # a group of zeros: a zero step
    kind = GGMLQuantizationType[grid.upper()]
    expected = quants.dequantize(quants.quantize(weight.numpy(), kind), kind)
    assert torch.equal(GRIDS[grid](weight), torch.from_numpy(expected.copy()))


def _packed(llm: LLM) -> dict[str, int | None]:
    """Each linear layer's grid code width, None where it stayed dense."""
    found = {}
    for name, module in llm.engine.model.named_modules():
        if hasattr(module, "method"):
            packed = grid_weight_of(module)
            found[name] = None if packed is None else packed.bits
    return found


@pytest.mark.skipif(bool(unavailable()), reason=f"CPU kernels: {unavailable()}")
@pytest.mark.parametrize("family", ["qwen2", "kimi_k2"])
def test_a_dense_checkpoint_is_packed_at_load_and_stays_close(family, tmp_path):
    overrides = {"kv_lora_rank": 32} if family == "kimi_k2" else {}  # kv_b_proj 32 wide
    folder = make_checkpoint(family, tmp_path / family, **overrides).path
    dense = LLM(str(folder), dtype="bfloat16", kv_cache_dtype="bf16")
    assert not any(_packed(dense).values())
    exact = dense.prompt_logits(PROMPT)
    spread = exact.std().item()
    for grid, body_bits, bound in (("q8_0", 8, 0.05), ("q4_0", 4, 0.5)):
        llm = LLM(str(folder), dtype="bfloat16", kv_cache_dtype="bf16", cpu_weights=grid)
        packed = _packed(llm)
        layers = {n: bits for n, bits in packed.items() if n != "lm_head"}
        if family == "kimi_k2":  # attention reads kv_b_proj's matrix: it stays dense
            assert layers.pop("model.layers.0.self_attn.kv_b_proj") is None
            layers = {n: b for n, b in layers.items() if not n.endswith("kv_b_proj")}
        assert set(layers.values()) == {body_bits}
        assert packed["lm_head"] == 8  # the head keeps Q8_0 under q4_0, as llama.cpp's does
        error = (llm.prompt_logits(PROMPT) - exact).abs().mean().item()
        assert error < bound * spread, (grid, error, spread)


@pytest.mark.skipif(bool(unavailable()), reason=f"CPU kernels: {unavailable()}")
def test_weights_already_on_a_grid_and_tied_embeddings_are_left_as_they_are(tmp_path):
    folder = put_on_grid(make_checkpoint("llama", tmp_path / "llama").path)  # tied embeddings
    kept = LLM(str(folder), dtype="bfloat16", kv_cache_dtype="bf16")
    requantized = LLM(str(folder), dtype="bfloat16", kv_cache_dtype="bf16", cpu_weights="q4_0")
    assert _packed(kept) == _packed(requantized)
    assert torch.equal(kept.prompt_logits(PROMPT), requantized.prompt_logits(PROMPT))
