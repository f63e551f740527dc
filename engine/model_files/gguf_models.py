"""Which family a GGUF file holds, and its plan: the dispatch over gguf_families.py
(llama, qwen2, glm4) and gguf_moe.py (glm4moe, deepseek2)."""

from __future__ import annotations

from typing import Any

from engine.errors import ModelError
from engine.model_files.gguf_families import (
    ORIGINAL_FOLDER,
    SUPPORTED_ARCHITECTURES,
    GGUFModel,
    Metadata,
    plan_dense,
    plan_llama,
)
from engine.model_files.gguf_moe import plan_deepseek2, plan_glm4_moe
from engine.model_files.gguf_plan import REFETCH_HINT


def plan_model(values: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> GGUFModel:
    """The Hugging Face model a GGUF file holds; `shapes` maps tensor names to numpy shapes."""
    meta = Metadata(values)
    architecture = meta.architecture
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"GGUF architecture {architecture!r} is not supported; the converter reads "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}. {ORIGINAL_FOLDER.capitalize()}."
        )
    if "rope_freqs.weight" in shapes:
        raise ModelError(
            "This GGUF uses Llama 3.1-style scaled RoPE (a rope_freqs tensor), which the converter "
            f"does not rebuild; {ORIGINAL_FOLDER}."
        )
    if "token_embd.weight" not in shapes:
        raise ModelError(f"GGUF has no token_embd.weight tensor; {REFETCH_HINT}.")
    if architecture == "llama":
        return plan_llama(meta, shapes)
    if architecture in ("qwen2", "glm4"):
        return plan_dense(meta, shapes)
    return (plan_glm4_moe if architecture == "glm4moe" else plan_deepseek2)(meta, shapes)
