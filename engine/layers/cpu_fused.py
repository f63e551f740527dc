"""Route a BF16 CPU model's small per-layer operators through the C layer kernels.

A decode step of a small model on CPU spends as much time in norms, rotary
embeddings, SwiGLU and the K/V Hadamard rotation, each several tiny torch
operators, as in its weight products. `use_cpu_layer_kernels` gives the
modules that do them a forward that makes one C call instead
(engine/cpu_kernels/layer_ops.c), with torch's rounding points; anything the
kernels do not take (other dtypes, devices, layouts) goes through the
module's own torch code. The model classes stay the reference: the engine
calls this only on CPU with BF16 activations and never in deterministic mode.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from engine.cpu_kernels import layer_ops
from engine.kv.rotation import HadamardRotation
from engine.layers.cpu_grid_weights import GridWeight
from engine.layers.linear_methods import grid_weight_of
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models.base import PreNormDecoderLayer
from engine.models.llama import GatedMLP


def _is_bf16_cpu(x: torch.Tensor) -> bool:
    return x.dtype == torch.bfloat16 and x.device.type == "cpu"


def _norm_forward(self: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    if _is_bf16_cpu(x) and self.weight.dtype == torch.bfloat16:
        return layer_ops.rms_norm(x, self.weight, self.eps)
    return RMSNorm.forward(self, x)


def _mlp_forward(self: GatedMLP, x: torch.Tensor) -> torch.Tensor:
    gate_up = self.gate_up_proj(x)
    if not _is_bf16_cpu(gate_up):
        return GatedMLP.forward(self, x)
    return self.down_proj(layer_ops.silu_mul(gate_up))


def _layer_forward(self: PreNormDecoderLayer, positions, x: torch.Tensor, ctx) -> torch.Tensor:
    norm = self.post_attention_layernorm
    if not (_is_bf16_cpu(x) and norm.weight.dtype == torch.bfloat16):
        return PreNormDecoderLayer.forward(self, positions, x, ctx)
    attended = self.self_attn(positions, self.input_layernorm(x), ctx)
    residual = x.clone(memory_format=torch.contiguous_format)
    # residual = x + attended (in place), and the post-attention norm of it, in one call
    normed = layer_ops.rms_norm(attended, norm.weight, norm.eps, residual=residual)
    return residual + self.mlp(normed)


def _rope_forward(self: RotaryEmbedding, positions, x: torch.Tensor, step_cache=None) -> None:
    if not (_is_bf16_cpu(x) and x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]):
        return RotaryEmbedding.forward(self, positions, x, step_cache)
    positions = positions if positions.dtype == torch.int64 else positions.long()
    layer_ops.rope_(
        x, positions.contiguous(), self.cos, self.sin, self.rotary_dim, self.interleaved
    )


def _hadamard_rotate(self: HadamardRotation, x: torch.Tensor) -> torch.Tensor:
    if not (
        _is_bf16_cpu(x) and x.dim() >= 2 and x.shape[-1] == self.dim and x.numel() > 0
    ) or self.block & (self.block - 1):
        return HadamardRotation.rotate(self, x)
    return layer_ops.hadamard_(x.contiguous().clone(), self.block)


def _fuse_decode(model: nn.Module) -> int:
    """Route decode steps of a Llama-family trunk through FusedDecode; 1 if it could."""
    from engine.layers.cpu_decode_step import FusedDecode
    from engine.models.llama import LlamaModel

    trunk = getattr(model, "model", None)
    if type(trunk) is not LlamaModel:
        return 0
    fused = FusedDecode.build(list(trunk.layers))
    if fused is None:
        return 0
    trunk.fused_decode = fused
    trunk.forward = types.MethodType(_trunk_forward, trunk)
    return 1


def _logits_forward(self, hidden: torch.Tensor) -> torch.Tensor:
    """The output head straight to float32 logits (no BF16 rounding and copy)."""
    packed = grid_weight_of(self.lm_head)
    if not isinstance(packed, GridWeight) or hidden.dtype not in (torch.float32, torch.bfloat16):
        return type(self).compute_logits(self, hidden)
    flat = hidden.reshape(-1, hidden.shape[-1]).contiguous()
    return packed.matmul(flat, torch.float32).reshape(*hidden.shape[:-1], packed.rows)


def _trunk_forward(self, input_ids, positions, ctx):
    """Embed, then every layer in one C call on decode steps it covers, then the final norm."""
    x = self.embed_tokens(input_ids)
    if not self.fused_decode.run(x, positions, ctx):
        for layer in self.layers:
            x = layer(positions, x, ctx)
    return self.norm(x)


# module type -> (count name, its C-kernel forward)
_FORWARDS = {
    RMSNorm: ("norm", _norm_forward),
    GatedMLP: ("mlp", _mlp_forward),
    PreNormDecoderLayer: ("layer", _layer_forward),
    RotaryEmbedding: ("rotary", _rope_forward),
}


def use_cpu_layer_kernels(model: nn.Module) -> dict[str, int]:
    """Give the model's norms, MLPs, decoder layers, rotary tables and K/V rotations
    their C-kernel forwards; returns how many of each were routed."""
    counts = {name: 0 for name, _ in _FORWARDS.values()} | {"rotation": 0, "head": 0}
    counts["fused decode"] = _fuse_decode(model)
    if isinstance(grid_weight_of(getattr(model, "lm_head", None)), GridWeight):
        model.compute_logits = types.MethodType(_logits_forward, model)
        counts["head"] = 1
    rotations: dict[int, HadamardRotation] = {}
    for module in model.modules():
        if type(module) in _FORWARDS:  # exact types: subclasses may compute differently
            name, forward = _FORWARDS[type(module)]
            module.forward = types.MethodType(forward, module)
            counts[name] += 1
        rotation = getattr(module, "kv_rotation", None)
        if isinstance(rotation, HadamardRotation) and not rotation.batch_invariant:
            rotations[id(rotation)] = rotation
    for rotation in rotations.values():
        rotation.rotate = types.MethodType(_hadamard_rotate, rotation)
        counts["rotation"] += 1
    return counts
