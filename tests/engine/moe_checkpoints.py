"""Tiny Glm4Moe and DeepseekV3 (Kimi) checkpoints, in the on-disk forms real ones use.

Built with transformers' own classes (DESIGN.md §5 configs) and saved with
`save_pretrained`, then optionally rewritten the way real releases differ:
Kimi K2's `kimi_k2` model_type with `rope_theta` + `rope_scaling`, Kimi
K2.5's `kimi_k25` wrapper (text model under `language_model.`, vision tower
beside it), FP8 block-quantized weights, INT4 pack-quantized experts. Each
quantized variant comes with a reference folder holding the dequantized
weights, which transformers loads as the expected model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.engine.checkpoints import save_model

DEEPSEEK_V3 = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    routed_scaling_factor=2.827,
    norm_topk_prob=True,
    max_position_embeddings=512,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 50000.0,
        "factor": 32.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    # Larger than the default 0.02, so logits and routing margins are not all near zero.
    initializer_range=0.1,
)

GLM4_MOE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    use_qk_norm=True,
    attention_bias=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
    max_position_embeddings=512,
    initializer_range=0.1,
)

# Kimi K2-Thinking's INT4 ignore list: everything but the routed experts stays bf16.
KIMI_INT4_IGNORE = [
    "lm_head",
    "re:.*self_attn.*",
    "re:.*shared_experts.*",
    r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
]


# Looser comparisons (bfloat16 weights, FP8 KV). A max over all logits is the
# wrong measure on these tiny MoE models: where two experts score within
# rounding of each other, bfloat16 or FP8 flips the choice and that position's
# logits move by up to ~2 (transformers' own bfloat16 run does the same). So:
# the mean |diff| over all logits, and the per-position max |diff| that 90% of
# positions stay within. Measured (3 prompts, logits reaching about +-3.5):
# FP8 KV mean <= 0.055, p90 <= 0.22 (DeepseekV3's latent cache), <= 0.10 (Glm4Moe);
# bfloat16 weights + KV against transformers in bfloat16: mean <= 0.03, p90 <= 0.045.
FP8_MEAN_BOUND, FP8_P90_BOUND = 0.1, 0.4
BF16_MEAN_BOUND, BF16_P90_BOUND = 0.05, 0.1


def assert_within_quantized_bounds(got: torch.Tensor, expected: torch.Tensor, fp8: bool) -> None:
    mean_bound, p90_bound = (
        (FP8_MEAN_BOUND, FP8_P90_BOUND) if fp8 else (BF16_MEAN_BOUND, BF16_P90_BOUND)
    )
    diff = (got - expected).abs()
    mean = diff.mean().item()
    p90 = diff.amax(dim=-1).quantile(0.9).item()
    assert mean < mean_bound and p90 < p90_bound, f"mean |diff| {mean:.4f}, p90 {p90:.4f}"
    # Most positions still predict the same token.
    agree = (got.argmax(-1) == expected.argmax(-1)).float().mean().item()
    assert agree >= 0.8, f"top-1 agreement {agree:.2f}"


def _randomize(model) -> None:
    """Give the parameters random init leaves trivial (norm gains, biases, expert bias) real values."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.2)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.5)
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.normal_(0.0, 0.1)


def build_deepseek_v3(directory: Path, seed: int = 0, **overrides) -> Path:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**DEEPSEEK_V3, **overrides})).eval()
    _randomize(model)
    return save_model(model, directory)


def build_glm4_moe(directory: Path, seed: int = 0, **overrides) -> Path:
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    torch.manual_seed(seed)
    model = Glm4MoeForCausalLM(Glm4MoeConfig(**{**GLM4_MOE, **overrides})).eval()
    _randomize(model)
    return save_model(model, directory)


def read_config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def write_config(directory: Path, config: dict) -> None:
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def copy_checkpoint(
    src: Path,
    dst: Path,
    tensors: dict[str, torch.Tensor],
    config_edit: Callable[[dict], dict] | None = None,
) -> Path:
    """A new folder with src's tokenizer and config (edited) and these tensors as one file."""
    dst.mkdir(parents=True, exist_ok=True)
    for file in src.iterdir():
        if file.suffix != ".safetensors" and file.name != "model.safetensors.index.json":
            shutil.copy(file, dst / file.name)
    config = read_config(src)
    write_config(dst, config_edit(config) if config_edit else config)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    return dst


def as_kimi_k2(src: Path, dst: Path) -> Path:
    """Rewrite a DeepseekV3 checkpoint's config as Kimi K2's: kimi_k2, rope_theta + rope_scaling."""

    def edit(config: dict) -> dict:
        rope = dict(config.pop("rope_parameters"))
        config["model_type"] = "kimi_k2"
        config["rope_theta"] = rope.pop("rope_theta")
        rope["type"] = rope.pop("rope_type")
        config["rope_scaling"] = rope
        # Real configs' head_dim (when present) is not an MLA head size; make misuse visible.
        config["head_dim"] = 128
        return config

    return copy_checkpoint(src, dst, read_tensors(src), edit)


def as_kimi_k25(src: Path, dst: Path) -> Path:
    """Nest a DeepseekV3 checkpoint as Kimi K2.5 does: kimi_k25 wrapper, language_model.* names."""
    tensors = {f"language_model.{k}": v for k, v in read_tensors(src).items()}
    tensors["vision_tower.patch_embed.proj.weight"] = torch.randn(8, 3, 2, 2)
    tensors["mm_projector.proj.0.weight"] = torch.randn(64, 32)

    def edit(text: dict) -> dict:
        text = dict(text)
        text.pop("architectures")
        text["model_type"] = "kimi_k2"
        return {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "model_type": "kimi_k25",
            "text_config": text,
            "vision_config": {"patch_size": 14, "hidden_size": 32},
        }

    return copy_checkpoint(src, dst, tensors, edit)


def is_linear_weight(name: str) -> bool:
    return name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight")


def fp8_block_reference(weight: torch.Tensor, block: tuple[int, int]):
    """Straightforward per-block FP8 quantization: (e4m3 weight, scale_inv, dequantized float32)."""
    rows, cols = weight.shape
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    quantized = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scale_inv = torch.empty(grid, dtype=torch.float32)
    restored = torch.empty(rows, cols, dtype=torch.float32)
    for i in range(grid[0]):
        for j in range(grid[1]):
            rs = slice(i * block[0], min((i + 1) * block[0], rows))
            cs = slice(j * block[1], min((j + 1) * block[1], cols))
            tile = weight[rs, cs].float()
            scale = (tile.abs().max() / 448.0).clamp_min(1e-12)
            q = (tile / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            quantized[rs, cs] = q
            scale_inv[i, j] = scale
            restored[rs, cs] = q.float() * scale
    return quantized, scale_inv, restored


def as_fp8_block(src: Path, dst: Path, ref: Path, block=(128, 128)) -> tuple[Path, Path]:
    """FP8 block-quantize every projection: (quantized folder, reference folder of dequantized weights)."""
    quantized: dict[str, torch.Tensor] = {}
    restored: dict[str, torch.Tensor] = {}
    for name, tensor in read_tensors(src).items():
        if is_linear_weight(name):
            q, scale_inv, dequantized = fp8_block_reference(tensor, block)
            quantized[name] = q
            quantized[name + "_scale_inv"] = scale_inv
            restored[name] = dequantized
        else:
            quantized[name] = restored[name] = tensor

    def edit(config: dict) -> dict:
        config["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(block),
        }
        return config

    return copy_checkpoint(src, dst, quantized, edit), copy_checkpoint(src, ref, restored)


def int4_group_reference(weight: torch.Tensor, group: int):
    """Symmetric INT4 per group of inputs: (int values -8..7, bf16 scales, dequantized float32)."""
    rows, cols = weight.shape
    groups = -(-cols // group)
    values = torch.empty(rows, cols, dtype=torch.int8)
    scales = torch.empty(rows, groups, dtype=torch.bfloat16)
    for g in range(groups):
        cs = slice(g * group, min((g + 1) * group, cols))
        tile = weight[:, cs].float()
        scale = (tile.abs().amax(dim=1) / 7.0).clamp_min(1e-8).to(torch.bfloat16)
        scales[:, g] = scale
        values[:, cs] = (tile / scale.float()[:, None]).round().clamp(-8, 7).to(torch.int8)
    restored = values.float() * scales.float().repeat_interleave(group, dim=1)[:, :cols]
    return values, scales, restored


def pack_int4_reference(values: torch.Tensor) -> torch.Tensor:
    """Eight nibbles (value + 8) per int32 along the input dim, first value in the low nibble."""
    rows, cols = values.shape
    words = -(-cols // 8)
    packed = torch.zeros(rows, words, dtype=torch.int32)
    for r in range(rows):
        for w in range(words):
            word = 0
            for i in range(8):
                c = w * 8 + i
                nibble = int(values[r, c]) + 8 if c < cols else 0
                word |= nibble << (4 * i)
            packed[r, w] = word - (1 << 32) if word >= 1 << 31 else word
    return packed


def is_routed_expert(name: str) -> bool:
    return ".mlp.experts." in name and is_linear_weight(name)


def as_int4_experts(src: Path, dst: Path, ref: Path, group: int = 32) -> tuple[Path, Path]:
    """Pack routed experts as compressed-tensors INT4: (quantized folder, reference folder)."""
    quantized: dict[str, torch.Tensor] = {}
    restored: dict[str, torch.Tensor] = {}
    for name, tensor in read_tensors(src).items():
        if is_routed_expert(name):
            values, scales, dequantized = int4_group_reference(tensor, group)
            module = name[: -len(".weight")]
            quantized[module + ".weight_packed"] = pack_int4_reference(values)
            quantized[module + ".weight_scale"] = scales
            quantized[module + ".weight_shape"] = torch.tensor(
                list(tensor.shape), dtype=torch.int32
            )
            restored[name] = dequantized
        else:
            quantized[name] = restored[name] = tensor

    def edit(config: dict) -> dict:
        config["quantization_config"] = int4_quantization_config(group)
        return config

    return copy_checkpoint(src, dst, quantized, edit), copy_checkpoint(src, ref, restored)


def int4_quantization_config(group: int = 32, ignore: list[str] | None = None) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "input_activations": None,
                "output_activations": None,
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": group,
                    "dynamic": False,
                    "actorder": None,
                },
            }
        },
        "ignore": list(KIMI_INT4_IGNORE if ignore is None else ignore),
        "kv_cache_scheme": None,
    }
