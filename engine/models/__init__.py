"""The engine's model classes, found by architecture name (config.json `architectures[0]`).

decoder.py holds the pieces they share, base.py the causal-LM base, one module
per family (llama.py, glm4.py, glm4_moe.py, deepseek_v3.py, deepseek_v32.py
(DeepSeek V3.2 and GLM-5.x), kimi_linear.py),
loader.py builds a model and reads its weights, cpu_decode_step.py runs a
whole decode step in C (cpu_decode_segments.py: in runs of layers, where only some
layers can be fused).
"""

from __future__ import annotations

from engine.errors import UnsupportedModelError


def _registry() -> dict[str, type]:
    from engine.models.deepseek_v3 import DeepseekV3ForCausalLM
    from engine.models.deepseek_v32 import DeepseekV32ForCausalLM, GlmMoeDsaForCausalLM
    from engine.models.glm4 import Glm4ForCausalLM
    from engine.models.glm4_moe import Glm4MoeForCausalLM
    from engine.models.kimi_linear import KimiLinearForCausalLM
    from engine.models.llama import LlamaForCausalLM, Qwen2ForCausalLM

    return {
        "LlamaForCausalLM": LlamaForCausalLM,
        "MistralForCausalLM": LlamaForCausalLM,
        "Qwen2ForCausalLM": Qwen2ForCausalLM,
        "Glm4ForCausalLM": Glm4ForCausalLM,
        "Glm4MoeForCausalLM": Glm4MoeForCausalLM,
        "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
        "DeepseekV32ForCausalLM": DeepseekV32ForCausalLM,
        "GlmMoeDsaForCausalLM": GlmMoeDsaForCausalLM,
        "KimiLinearForCausalLM": KimiLinearForCausalLM,
    }


def supported_architectures() -> list[str]:
    return sorted(_registry())


def model_class(architecture: str) -> type:
    registry = _registry()
    if architecture not in registry:
        raise UnsupportedModelError(
            f"architecture {architecture!r} is not supported; supported: "
            + ", ".join(sorted(registry))
        )
    return registry[architecture]
