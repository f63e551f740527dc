"""The Kimi/DeepSeek V3 and GLM-4.5 decode steps' layers in one C call (engine/models/
cpu_mla_decode_step.py, cpu_decode_step.py) against the modules they replace: the same
kernels in the same order, so the logits of every decode step are the same bits."""

from __future__ import annotations

import pytest
import torch

from engine.cpu_kernels import library
from engine.models.cpu_decode_step import FusedDecode
from engine.models.cpu_mla_decode_step import FusedMLADecode
from tests.engine.agreement import teacher_forced

pytestmark = pytest.mark.skipif(
    bool(library.unavailable()), reason=f"CPU kernels: {library.unavailable()}"
)
# MLA widths the C step takes (latent and rope key whole vectors of 16), MoE after layer 0.
WIDE_MLA = dict(kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=16)
SEQUENCES = [[5, 17, 42, 99, 3, 250, 7, 61, 88, 130, 12], [33, 201, 4, 76] * 5]


@pytest.fixture(scope="module")
def wide_deepseek_v3(tmp_path_factory):
    from engine.devtools.testing.checkpoints import build_deepseek_v3

    return build_deepseek_v3(tmp_path_factory.mktemp("mla_step") / "deepseek_v3", **WIDE_MLA)


@pytest.fixture(scope="module")
def glm4_moe(tmp_path_factory):
    from engine.devtools.testing.checkpoints import build_glm4_moe

    return build_glm4_moe(tmp_path_factory.mktemp("glm_step") / "glm4_moe", head_dim=32)


def fused_and_modules_agree(llm, monkeypatch, kind=FusedMLADecode) -> None:
    """Teacher-forced logits with the fused step, then with the modules: the same bits,
    and the fused step took every decode step."""
    trunk = llm.engine.model.model
    assert isinstance(trunk.decode_step, kind)
    step, taken = trunk.decode_step, []
    run = step.run
    monkeypatch.setattr(step, "run", lambda *args: taken.append(run(*args)) or taken[-1])
    fused = teacher_forced(llm, SEQUENCES, decoded=8)
    assert taken.count(True) == 8 * len(SEQUENCES)  # every decode step; prefill declined
    trunk.decode_step = None
    modules = teacher_forced(llm, SEQUENCES, decoded=8)
    assert torch.equal(fused, modules)


@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_the_fused_step_computes_what_the_modules_compute(wide_deepseek_v3, kv, monkeypatch):
    """A BF16 checkpoint quantized at load (grid weights, a dense kv_b_proj), the MoE
    layers' C call, the FP8 cache's rotations."""
    from engine import LLM

    llm = LLM(str(wide_deepseek_v3), dtype="bfloat16", kv_cache_dtype=kv, cpu_weights="q8_0")
    fused_and_modules_agree(llm, monkeypatch)


def test_layers_it_cannot_run_keep_the_modules(wide_deepseek_v3):
    """Dense BF16 weights (no grid) leave the trunk to its modules."""
    from engine import LLM

    llm = LLM(str(wide_deepseek_v3), dtype="bfloat16", kv_cache_dtype="bf16")
    assert llm.engine.model.model.decode_step is None


@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_a_glm_moe_step_computes_what_the_modules_compute(glm4_moe, kv, monkeypatch):
    """GLM-4.5's per-head q/k norms, partial NeoX rotary, q/k/v biases and MoE layers with
    a shared expert, in the Llama family's C step."""
    from engine import LLM

    llm = LLM(str(glm4_moe), dtype="bfloat16", kv_cache_dtype=kv, cpu_weights="q8_0")
    fused_and_modules_agree(llm, monkeypatch, kind=FusedDecode)


@pytest.fixture(scope="module")
def glm4_moe_4_layers(tmp_path_factory):
    from engine.devtools.testing.checkpoints import build_glm4_moe

    folder = tmp_path_factory.mktemp("glm_segments") / "glm4_moe"
    return build_glm4_moe(folder, head_dim=32, num_hidden_layers=4)


def test_runs_of_fusable_layers_fuse_around_the_others(glm4_moe_4_layers, monkeypatch):
    """A layer the C step cannot run (here: declared so, as a layer a file leaves dense
    is) stays a module between fused runs, and every decode step gives the modules'
    bits."""
    from engine import LLM
    from engine.models import cpu_decode_step
    from engine.models.cpu_decode_segments import FusedSegments

    llm = LLM(
        str(glm4_moe_4_layers), dtype="bfloat16", kv_cache_dtype="fp8_e4m3", cpu_weights="q8_0"
    )
    model = llm.engine.model
    layers = list(model.model.layers)
    odd_one = layers[2]
    fusable = cpu_decode_step._fusable
    monkeypatch.setattr(
        cpu_decode_step,
        "_fusable",
        lambda layer, first: layer is not odd_one and fusable(layer, first),
    )
    segments = cpu_decode_step.fused_decode_for(model)
    assert isinstance(segments, FusedSegments)
    assert [fused for fused, _ in segments.pieces] == [True, False, True]
    assert [len(step.layers) for step in segments.fused] == [2, 1]
    model.use_decode_step(segments)
    fused_and_modules_agree(llm, monkeypatch, kind=FusedSegments)
