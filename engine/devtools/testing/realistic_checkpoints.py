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
1.93B (433M active); `layers` cuts them shorter for quick runs.
"""

from __future__ import annotations

import json
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
    max_position_embeddings=16384,
    tie_word_embeddings=False,
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
            num_attention_heads=16,
            num_key_value_heads=16,
            q_lora_rank=768,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            routed_scaling_factor=2.827,
            rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        ),
    ),
}


def realistic_config(family: str, layers: int | None = None) -> dict:
    import transformers

    config_class, model_class, fields = SHAPES[family]
    fields = dict(fields)
    if layers is not None:
        fields["num_hidden_layers"] = layers
    cfg = getattr(transformers, config_class)(**fields)
    cfg.architectures = [model_class]
    cfg.dtype = "bfloat16"
    cfg.bos_token_id, cfg.eos_token_id = 0, 2
    return cfg.to_dict()


def _tensor_shapes(family: str, cfg: dict) -> dict[str, tuple[int, ...]]:
    import transformers

    config_class, model_class, _ = SHAPES[family]
    config = getattr(transformers, config_class)(**cfg)
    with torch.device("meta"):
        model = getattr(transformers, model_class)(config)
    shapes = {}
    for name, tensor in model.state_dict().items():
        shape = tuple(tensor.shape)
        # transformers holds a layer's routed experts as two stacked tensors and saves
        # them one expert at a time (the released form): list them so.
        if name.endswith("mlp.experts.gate_up_proj"):
            experts, rows, hidden = shape
            for e in range(experts):
                for part in ("gate_proj", "up_proj"):
                    shapes[f"{name[: -len('gate_up_proj')]}{e}.{part}.weight"] = (rows // 2, hidden)
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(shape[0]):
                shapes[f"{name[: -len('down_proj')]}{e}.down_proj.weight"] = shape[1:]
        else:
            shapes[name] = shape
    return shapes


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
    if name.endswith("mlp.gate.weight") or shape[1] % GROUP:
        return weight  # the router stays float32, as a GGUF keeps it
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
            if tensor.dim() != 2 or tensor.shape[1] % GROUP or name.endswith("mlp.gate.weight"):
                continue
            grid = name.endswith(("embed_tokens.weight", "lm_head.weight"))
            tensors[name] = (q8_0_values if grid else q4_1_values)(tensor).to(tensor.dtype)
        save_file(tensors, str(shard), metadata={"format": "pt"})
    return Path(directory)


def parameter_shapes(family: str, layers: int | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor `write_realistic_checkpoint` writes for `family`: name -> shape."""
    return _tensor_shapes(family, realistic_config(family, layers))
