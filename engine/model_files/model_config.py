"""Reads a Hugging Face config.json into the few facts the engine needs.

Real checkpoints disagree on spelling: older ones write `rope_theta` plus
`rope_scaling`, transformers 5 writes `rope_parameters`; Kimi K2.5/K2.6 nest the
language model under `text_config`. This module is the one place that knows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import CheckpointError
from engine.model_files.config_aliases import normalise_keys

# Configs whose model_type transformers does not know but whose weights follow
# a known architecture.
MODEL_TYPE_ALIASES = {"kimi_k2": "deepseek_v3"}
# The architecture to assume when a config (typically a nested text_config)
# names a model_type but no `architectures`.
MODEL_TYPE_ARCHITECTURES = {
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "deepseek_v32": "DeepseekV32ForCausalLM",
    "glm_moe_dsa": "GlmMoeDsaForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "glm4": "Glm4ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "kimi_linear": "KimiLinearForCausalLM",
}


@dataclass
class ModelConfig:
    """The raw config dict plus normalised accessors."""

    raw: dict[str, Any]
    architecture: str
    path: Path | None = None
    rope: dict[str, Any] = field(default_factory=dict)
    # model_type of the multimodal wrapper whose text_config this is (kimi_k25), else None.
    wrapper_model_type: str | None = None
    # quantization_config from the text config or, failing that, the wrapper.
    quantization: dict[str, Any] | None = None

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def __getitem__(self, key: str) -> Any:
        try:
            return self.raw[key]
        except KeyError:
            raise CheckpointError(
                f"config.json has no '{key}', which {self.architecture} needs"
            ) from None

    @property
    def hidden_size(self) -> int:
        return self["hidden_size"]

    @property
    def num_layers(self) -> int:
        return self["num_hidden_layers"]

    @property
    def num_heads(self) -> int:
        return self["num_attention_heads"]

    @property
    def num_kv_heads(self) -> int:
        return self.get("num_key_value_heads") or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.get("head_dim") or self.hidden_size // self.num_heads

    @property
    def vocab_size(self) -> int:
        return self["vocab_size"]

    @property
    def max_position_embeddings(self) -> int:
        return self.get("max_position_embeddings") or 2048

    @property
    def rope_theta(self) -> float:
        return float(self.rope.get("rope_theta", 10000.0))

    @property
    def partial_rotary_factor(self) -> float:
        return float(self.rope.get("partial_rotary_factor", 1.0))

    @property
    def torch_dtype_name(self) -> str | None:
        return self.get("torch_dtype") or self.get("dtype")


def _normalise_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """One dict holding rope_type, rope_theta and scaling fields, whichever spelling."""
    rope: dict[str, Any] = {}
    params = cfg.get("rope_parameters")
    if isinstance(params, dict):
        rope.update(params)
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict):
        for key, value in scaling.items():
            rope.setdefault(key, value)
        if "type" in scaling:
            rope.setdefault("rope_type", scaling["type"])
    if "rope_theta" in cfg:
        rope.setdefault("rope_theta", cfg["rope_theta"])
    if "partial_rotary_factor" in cfg:
        rope.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
    rope.setdefault("rope_type", "default")
    return rope


def parse_config(raw: dict[str, Any], path: Path | None = None) -> ModelConfig:
    """Normalise a config dict: unwrap `text_config`, alias model types, read rope."""
    wrapper_type = None
    quantization = raw.get("quantization_config")
    if raw.get("model_type") == "kimi_k25" or (
        "text_config" in raw and "num_hidden_layers" not in raw
    ):
        text = dict(raw.get("text_config") or {})
        if not text:
            raise CheckpointError(f"{path}: config has no text_config to load")
        wrapper_type = raw.get("model_type") or "unknown"
        raw = text
    raw = dict(raw)
    quantization = raw.get("quantization_config") or quantization
    model_type = raw.get("model_type")
    if model_type in MODEL_TYPE_ALIASES:
        raw["model_type"] = MODEL_TYPE_ALIASES[model_type]
    raw = normalise_keys(raw)  # families that spell some keys their own way
    archs = raw.get("architectures") or []
    if not archs and raw.get("model_type") in MODEL_TYPE_ARCHITECTURES:
        archs = [MODEL_TYPE_ARCHITECTURES[raw["model_type"]]]
    if not archs:
        raise CheckpointError(
            f"{path or 'config'}: no 'architectures' entry, so the model class is unknown"
        )
    return ModelConfig(
        raw=raw,
        architecture=archs[0],
        path=path,
        rope=_normalise_rope(raw),
        wrapper_model_type=wrapper_type,
        quantization=quantization,
    )


def load_config(model_dir: Path) -> ModelConfig:
    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        raise CheckpointError(
            f"{model_dir} has no config.json; pass a Hugging Face model folder, "
            "a .gguf file, or a model name from `resident models list`"
        )
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{config_file} is not valid JSON: {err}") from None
    return parse_config(raw, path=Path(model_dir))
