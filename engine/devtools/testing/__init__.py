"""Tiny checkpoints for tests and benchmarks, in the on-disk forms real releases use.

- `checkpoints`: the models (Llama, Qwen2, GLM-4, GLM-4.5 MoE, Kimi K2/K2.5)
  and `make_checkpoint`, the one-call entry.
- `layouts`: folder I/O and the Kimi config/sharding/nesting rewrites.
- `quantized`: FP8-block and INT4 pack-quantized variants with references.
- `tokenizers`, `chat_templates`: the ChatML, GLM and Kimi tokenizers and templates.

Imports torch and transformers; nothing in the engine's serving path imports this.
"""

from engine.devtools.testing.checkpoints import (
    FAMILIES,
    QUANTIZERS,
    TinyCheckpoint,
    glm4_moe_checkpoint,
    kimi_checkpoint,
    make_checkpoint,
)

__all__ = [
    "FAMILIES",
    "QUANTIZERS",
    "TinyCheckpoint",
    "glm4_moe_checkpoint",
    "kimi_checkpoint",
    "make_checkpoint",
]
