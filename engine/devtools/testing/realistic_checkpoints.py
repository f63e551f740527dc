"""Random-weight checkpoints of the served families at realistic size, on a GGUF grid.

Speed does not depend on the weights' values, but it does depend on their
shapes and on whether the engine can keep them packed. Each family's
transformers class is built on the meta device to list its tensors (names
and shapes exactly as transformers saves them), then every tensor is drawn
one at a time and written in shards, so a 2B model never sits in memory
whole. Linear weights are rounded onto llama.cpp's Q4_1 grid (per group of
32: `d * q + m`, q in 0..15, d and m IEEE half), embeddings and the head onto
Q8_0 (`d * q`, q in -127..127), as a Q4_1 GGUF file of the same model would
hold them; norms are ones. The folder is float32, so the values stay exactly
on the grid for the engine to pack, and transformers and llama.cpp's
converter read it like any model folder.

Shapes (`SHAPES`) are the issue-37 scale-downs of the families: a dense
Llama of 1.07B, GLM-4.5's MoE at 1.90B (402M active) and Kimi K2's MLA MoE at
1.93B (433M active); and issue 41's newer families on Kimi K2's body (the same
MLA and MoE sizes, so the long-context figure compares attention alone):
GLM-5.x's sparse attention (`glm5`) and Kimi Linear's KDA/MLA hybrid
(`kimi_linear`). `layers` cuts them shorter for quick runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.devtools.testing.shard_writer import ShardWriter
from engine.devtools.testing.tokenizers import save_bpe_tokenizer
from engine.weights.grid_rounding import GROUP, q4_1_values, q8_0_values

_MOE = dict(
    hidden_size=1280,
    num_hidden_layers=14,
    n_routed_experts=64,
    num_experts_per_tok=8,
    n_shared_experts=1,
    moe_intermediate_size=512,
    intermediate_size=4096,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
    vocab_size=32000,
    # Room for the long-context figure's 32k prompts plus their decode.
    max_position_embeddings=65536,
    tie_word_embeddings=False,
)
# Kimi K2's latent attention (DeepSeek V3's MLA).
_MLA = dict(
    num_attention_heads=16,
    num_key_value_heads=16,
    q_lora_rank=768,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
)
SHAPES = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=32000,
            max_position_embeddings=16384,
            tie_word_embeddings=False,
        ),
    ),
    "glm4_moe": (
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        dict(
            _MOE,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=128,
            use_qk_norm=True,
            attention_bias=True,
            routed_scaling_factor=2.5,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e6,
                "partial_rotary_factor": 0.5,
            },
        ),
    ),
    "kimi_k2": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            _MOE,
            **_MLA,
            routed_scaling_factor=2.827,
            rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        ),
    ),
    # GLM-5.x: kimi_k2's body plus the indexer at GLM-5's proportions (index heads half
    # the attention heads, 32 of 64; keys of 128; top-2048) and GLM-5.2's shared
    # indexers (layers 0-2 run theirs, then every fourth: engine/planner/sparse_presets.py).
    "glm5": (
        "GlmMoeDsaConfig",
        "GlmMoeDsaForCausalLM",
        dict(
            _MOE,
            **_MLA,
            index_n_heads=8,
            index_head_dim=128,
            index_topk=2048,
            index_topk_freq=4,
            index_skip_topk_offset=3,
            routed_scaling_factor=2.5,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        ),
    ),
    # Kimi Linear: KDA heads as many as attention heads, of 128 (the 48B release's 32 of
    # 128 at 32 heads), a width-4 convolution; its MLA without q_lora as released. The
    # layer plan (_kimi_linear_layer_types) is set per depth.
    "kimi_linear": (
        "KimiLinearConfig",
        "KimiLinearForCausalLM",
        dict(
            {key: value for key, value in _MOE.items() if key != "n_routed_experts"},
            **{**_MLA, "q_lora_rank": None},
            num_local_experts=_MOE["n_routed_experts"],
            linear_num_heads=16,
            linear_head_dim=128,
            linear_conv_kernel_dim=4,
            pad_token_id=0,
        ),
    ),
}


def _kimi_linear_layer_types(layers: int) -> list[str]:
    """The 48B release's plan at any depth: MLA at every fourth layer (1-based) and at the
    last, KDA elsewhere (27 layers: 20 KDA, 7 MLA; 14 layers: 10 KDA, 4 MLA)."""
    return [
        "full_attention" if (i + 1) % 4 == 0 or i == layers - 1 else "linear_attention"
        for i in range(layers)
    ]


# Fields that depend on the depth, per family.
_DEPTH_FIELDS = {
    "kimi_linear": lambda layers: {"layer_types": _kimi_linear_layer_types(layers)},
}


def realistic_config(family: str, layers: int | None = None) -> dict:
    import transformers

    config_class, model_class, fields = SHAPES[family]
    fields = dict(fields)
    if layers is not None:
        fields["num_hidden_layers"] = layers
    if family in _DEPTH_FIELDS:
        fields.update(_DEPTH_FIELDS[family](fields["num_hidden_layers"]))
    cfg = getattr(transformers, config_class)(**fields)
    cfg.architectures = [model_class]
    cfg.dtype = "bfloat16"
    cfg.bos_token_id, cfg.eos_token_id = 0, 2
    return cfg.to_dict()


def _tensor_shapes(family: str, cfg: dict) -> dict[str, tuple[int, ...]]:
    """Names and shapes as transformers saves the family: the model's state dict through
    transformers' own save-time conversion (experts one at a time, Kimi Linear's released
    names), which runs on meta tensors as well as on real ones."""
    import transformers
    from transformers.core_model_loading import revert_weight_conversion

    config_class, model_class, _ = SHAPES[family]
    config = getattr(transformers, config_class)(**cfg)
    with torch.device("meta"):
        model = getattr(transformers, model_class)(config)
    saved = revert_weight_conversion(model, model.state_dict())
    return {_released_name(name): tuple(tensor.shape) for name, tensor in saved.items()}


# transformers saves Kimi Linear's dense first MLP under `block_sparse_moe.` too; the
# release (and llama.cpp's converter) has it under `mlp.`, as the engine reads either.
_DENSE_UNDER_MOE_NAME = re.compile(r"\.block_sparse_moe\.(?=(gate|up|down)_proj\.)")


def _released_name(name: str) -> str:
    return _DENSE_UNDER_MOE_NAME.sub(".mlp.", name)


def _is_router(name: str) -> bool:
    # `mlp.gate` in most families, `block_sparse_moe.gate` in Kimi Linear's files.
    return name.endswith(".gate.weight")


def _values(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    if len(shape) == 1:
        # Norm gains are ones; biases and the router's correction bias small.
        if name.endswith("norm.weight"):
            return torch.ones(shape)
        return torch.randn(shape, generator=generator) * 0.02
    scale = shape[1] ** -0.5
    weight = torch.randn(shape, generator=generator) * scale
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return q8_0_values(weight)
    if _is_router(name) or len(shape) != 2 or shape[1] % GROUP:
        return weight  # routers and convolutions stay float32, as a GGUF keeps them
    return q4_1_values(weight)


def write_realistic_checkpoint(
    directory: Path,
    family: str,
    layers: int | None = None,
    shard_mb: int = 1024,
    seed: int = 0,
    tokenizer=save_bpe_tokenizer,
) -> Path:
    """Write `family`'s realistic shape (SHAPES) into `directory`; returns the folder.
    `tokenizer(directory, vocab_size)` saves the tokenizer (e.g. save_glm_tokenizer, which
    llama.cpp's GLM converter needs)."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = realistic_config(family, layers)
    generator = torch.Generator().manual_seed(seed)
    writer = ShardWriter(directory, shard_mb)
    for name, shape in _tensor_shapes(family, cfg).items():
        tensor = _values(name, shape, generator).contiguous()
        writer.add(name, tensor)
    writer.close()
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    tokenizer(directory, cfg["vocab_size"])
    return directory


def put_on_grid(directory: Path) -> Path:
    """Round a saved float32 checkpoint's weights onto the GGUF grids in place (`_values`'
    rules: linear weights Q4_1, embeddings and head Q8_0, routers and norms as they are),
    so a tiny test model packs the way a GGUF-born one does."""
    from safetensors.torch import load_file

    for shard in sorted(Path(directory).glob("*.safetensors")):
        tensors = load_file(str(shard))
        for name, tensor in tensors.items():
            if tensor.dim() != 2 or tensor.shape[1] % GROUP or _is_router(name):
                continue
            grid = name.endswith(("embed_tokens.weight", "lm_head.weight"))
            tensors[name] = (q8_0_values if grid else q4_1_values)(tensor).to(tensor.dtype)
        save_file(tensors, str(shard), metadata={"format": "pt"})
    return Path(directory)


def parameter_shapes(family: str, layers: int | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor `write_realistic_checkpoint` writes for `family`: name -> shape."""
    return _tensor_shapes(family, realistic_config(family, layers))
