"""All decoder layers of a decode step in one C call (engine/cpu_kernels/decode_layers.c).

With the C layer ops (engine/layers/layer_ops.py) and grid weights a
Llama-family decode step is a chain of C calls joined by Python: module
calls, views, argument checks, ctypes conversions, about a quarter of a step
at 16 rows of the default model. `FusedDecode` describes the model to C once
(weight pointers, shapes) and is the trunk's `decode_step`
(engine/models/decoder.py LlamaModel): the trunk hands it each step, and
`decode_layers` runs the same kernels in the same order. Steps it does not
cover (prefill, another attention backend, a pool still calibrating or
observing) run the modules as before. It runs no collectives, so the engine
sets it only with one tensor-parallel rank.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from engine.attention.cpu_backend import CPUAttentionBackend
from engine.cpu_kernels.grid_matmul import GridWeightRef
from engine.cpu_kernels.library import library
from engine.cpu_kernels.paged_decode import KV_KINDS, supports
from engine.kv.rotation import HadamardRotation
from engine.layers.cpu_grid_weights import GridParts, GridWeight, grid_weight_of
from engine.layers.moe import SparseMoE
from engine.models.decoder import GatedMLP, GQAAttention, LlamaModel, PreNormDecoderLayer
from engine.models.glm4_moe import Glm4MoeAttention

_PTR, _I64, _FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _PTR),
        ("post_norm", _PTR),
        ("q_norm", _PTR),
        ("k_norm", _PTR),
        ("qkv", GridWeightRef * 3),
        ("o", GridWeightRef),
        ("gate_up", GridWeightRef),
        ("down", GridWeightRef),
        ("routing", _PTR),
        ("experts", _PTR),
        ("gate_up_format", _I64),
        ("down_format", _I64),
        ("expert_intermediate", _I64),
        ("kv", _PTR),
        ("k_scale", _PTR),
        ("v_scale", _PTR),
        ("k_factor", _PTR),
        ("v_factor", _PTR),
        ("qkv_parts", _I64),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        *((name, _I64) for name in ("hidden", "q_heads", "kv_heads", "head_dim", "intermediate")),
        *((name, _I64) for name in ("rot_dim", "interleaved", "hadamard_block", "kv_kind")),
        ("cos", _PTR),
        ("sin", _PTR),
        ("eps", _FLOAT),
        ("softmax_scale", _FLOAT),
    ]


def _grid(linear: nn.Module) -> GridWeight | None:
    packed = grid_weight_of(linear)
    return packed if isinstance(packed, GridWeight) else None


def _qkv_parts(linear: nn.Module) -> list[GridWeight] | None:
    """The qkv projection as the C step takes it: one grid weight, or its q, k and v parts
    each in its own format (GridParts: a Q4_K_M file's Q6_K v beside Q4_K q and k)."""
    packed = grid_weight_of(linear)
    if isinstance(packed, GridWeight):
        return [packed]
    if isinstance(packed, GridParts) and len(packed.parts) == 3:
        return packed.parts if all(isinstance(p, GridWeight) for p in packed.parts) else None
    return None


def _mlp_fusable(mlp) -> bool:
    """A dense MLP of grid weights, or a MoE layer whose C form is installed."""
    if isinstance(mlp, SparseMoE):
        return mlp.cpu_block is not None
    return type(mlp) is GatedMLP and all(
        _grid(m) is not None for m in (mlp.gate_up_proj, mlp.down_proj)
    )


def _qk_norms(attn) -> tuple:
    """GLM-4.5's per-head q and k norms, or (None, None)."""
    return (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None))


def _fusable(layer, first_layer) -> bool:
    """A Llama- or GLM-4.5-family layer with packed weights, shaped and rotated like the
    first one."""
    if type(layer) is not PreNormDecoderLayer:
        return False
    attn, mlp, first = layer.self_attn, layer.mlp, first_layer.self_attn
    if type(attn) not in (GQAAttention, Glm4MoeAttention) or type(attn) is not type(first):
        return False
    eps = first_layer.input_layernorm.eps
    qk_norms = [n for n in _qk_norms(attn) if n is not None]
    if len(qk_norms) not in (0, 2) or bool(qk_norms) != (_qk_norms(first)[0] is not None):
        return False
    norms = (layer.input_layernorm, layer.post_attention_layernorm, *qk_norms)
    rotation, first_rotation = attn.kv_rotation, first.kv_rotation
    rotation_ok = (rotation is None and first_rotation is None) or (
        isinstance(rotation, HadamardRotation)
        and first_rotation is not None
        and not rotation.batch_invariant
        and rotation.block == first_rotation.block
        and not rotation.block & (rotation.block - 1)
    )
    shape = (attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.scale)
    return (
        _qkv_parts(attn.qkv_proj) is not None
        and _grid(attn.o_proj) is not None
        and _mlp_fusable(mlp)
        and all(n.weight.dtype == torch.bfloat16 and n.eps == eps for n in norms)
        and attn.rotary is first.rotary
        and shape == (first.num_heads, first.num_kv_heads, first.head_dim, first.scale)
        and rotation_ok
        and sum(part.rows for part in _qkv_parts(attn.qkv_proj))
        == (attn.num_heads + 2 * attn.num_kv_heads) * attn.head_dim
    )


class FusedDecode:
    """The layers of one model, described for `decode_layers`; `run` takes a decode step."""

    def __init__(self, layers: list[PreNormDecoderLayer], first: int = 0, total: int = 0):
        attn = layers[0].self_attn
        rotation = attn.kv_rotation
        self.layers = layers
        # Layers [first, first + len(layers)) of a model of `total` layers (its KV pool's).
        self.first, self.total = first, total or first + len(layers)
        self.moe_blocks = [
            layer.mlp.cpu_block for layer in layers if isinstance(layer.mlp, SparseMoE)
        ]
        # The scratch of the widest dense MLP (MoE layers keep their own).
        dense = [
            _grid(layer.mlp.gate_up_proj).rows // 2
            for layer in layers
            if type(layer.mlp) is GatedMLP
        ]
        self.head_dim = attn.head_dim
        self.model = _Model(
            hidden=layers[0].input_layernorm.weight.numel(),
            q_heads=attn.num_heads,
            kv_heads=attn.num_kv_heads,
            head_dim=attn.head_dim,
            intermediate=max(dense, default=1),
            rot_dim=attn.rotary.rotary_dim,
            interleaved=int(attn.rotary.interleaved),
            hadamard_block=rotation.block if rotation is not None else 0,
            cos=attn.rotary.cos.data_ptr(),
            sin=attn.rotary.sin.data_ptr(),
            eps=layers[0].input_layernorm.eps,
            softmax_scale=attn.scale,
        )
        self._scales_key: tuple = (None, -1)
        self._scales: list = []
        self._array = None

    @classmethod
    def build(cls, layers, first: int = 0, total: int = 0) -> FusedDecode | None:
        """The fused form when every layer is one the C code implements, else None."""
        if not layers or not all(_fusable(layer, layers[0]) for layer in layers):
            return None
        attn = layers[0].self_attn
        rotary = attn.rotary
        if not (
            rotary.cos.dtype == torch.float32
            and rotary.cos.is_contiguous()
            and rotary.sin.is_contiguous()
            and attn.head_dim % 16 == 0
            and attn.num_heads % attn.num_kv_heads == 0
        ):
            return None
        return cls(layers, first, total)

    def _layer_array(self, pool, scales) -> ctypes.Array:
        array = (_Layer * len(self.layers))()
        for index, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            (k_scale, v_scale), (k_factor, v_factor) = scales[index]
            q_norm, k_norm = _qk_norms(attn)
            qkv = _qkv_parts(attn.qkv_proj)
            if isinstance(mlp, SparseMoE):
                block = mlp.cpu_block
                ffn = dict(
                    routing=ctypes.addressof(block.routing),
                    experts=ctypes.addressof(block.experts.experts),
                    gate_up_format=int(block.experts.gate_up_format),
                    down_format=int(block.experts.down_format),
                    expert_intermediate=block.experts.intermediate,
                    gate_up=block.shared_gate_up or GridWeightRef(),
                    down=block.shared_down or GridWeightRef(),
                )
            else:
                ffn = dict(
                    gate_up=GridWeightRef.of(_grid(mlp.gate_up_proj)),
                    down=GridWeightRef.of(_grid(mlp.down_proj)),
                )
            array[index] = _Layer(
                input_norm=layer.input_layernorm.weight.data_ptr(),
                post_norm=layer.post_attention_layernorm.weight.data_ptr(),
                q_norm=None if q_norm is None else q_norm.weight.data_ptr(),
                k_norm=None if k_norm is None else k_norm.weight.data_ptr(),
                qkv=(GridWeightRef * 3)(*map(GridWeightRef.of, qkv)),
                qkv_parts=len(qkv),
                o=GridWeightRef.of(_grid(attn.o_proj)),
                kv=pool.storage[self.first + index].data_ptr(),
                k_scale=k_scale.data_ptr(),
                v_scale=v_scale.data_ptr(),
                k_factor=k_factor.data_ptr(),
                v_factor=v_factor.data_ptr(),
                **ffn,
            )
        return array

    def run(self, x: torch.Tensor, positions: torch.Tensor, ctx) -> bool:
        """Run every layer on x [tokens, hidden] in place; False (x untouched) if not fusable."""
        if not self.accepts(x, ctx):
            return False
        self.run_accepted(x, positions, ctx)
        return True

    def accepts(self, x: torch.Tensor, ctx) -> bool:
        """Whether `run` would take this step."""
        meta, pool = ctx.meta, ctx.pool
        return (
            meta.decode_only
            and type(ctx.backend) is CPUAttentionBackend
            and x.dtype == torch.bfloat16
            and x.is_contiguous()
            and x.device.type == "cpu"
            and hasattr(pool, "writes_plainly")
            and supports(pool.storage[0], self.head_dim)
            and pool.storage.shape[0] == self.total
            and all(block.takes(x) for block in self.moe_blocks)
            # still calibrating or observing: the modules write
            and pool.writes_plainly()
        )

    def run_accepted(self, x: torch.Tensor, positions: torch.Tensor, ctx) -> None:
        meta, pool = ctx.meta, ctx.pool
        if (pool, pool.scales_version) != self._scales_key:
            layers = range(self.first, self.first + len(self.layers))
            scales = [(pool.write_scales(i), pool.head_factors(i)) for i in layers]
            self._array = self._layer_array(pool, scales)
            self._scales = scales  # the array points into these tensors
            self._scales_key = (pool, pool.scales_version)
            self.model.kv_kind = KV_KINDS[pool.storage.dtype]
        # Held here: the C call reads them through their pointers.
        positions = positions.to(torch.int64).contiguous()
        lengths = meta.context_lengths()
        status = library().decode_layers(
            ctypes.addressof(self.model),
            ctypes.addressof(self._array),
            len(self.layers),
            x.data_ptr(),
            x.shape[0],
            positions.data_ptr(),
            meta.slot_mapping.data_ptr(),
            meta.context_slots.data_ptr(),
            meta.context_slots.shape[1],
            lengths.data_ptr(),
            torch.get_num_threads(),
        )
        if status != 0:
            raise MemoryError("decode_layers could not allocate its scratch buffers")


def fused_decode_for(model: nn.Module):
    """The fused decode step for a model whose trunk is the Llama one (Llama-family layers,
    or MLA layers: engine/models/cpu_mla_decode_step.py), else None. Where only some
    Llama-family layers can be fused (others left dense, say), runs of them are fused
    and the others stay modules (engine/models/cpu_decode_segments.py)."""
    from engine.models.cpu_decode_segments import FusedSegments
    from engine.models.cpu_mla_decode_step import FusedMLADecode

    trunk = getattr(model, "model", None)
    if type(trunk) is not LlamaModel:
        return None
    layers = list(trunk.layers)
    return (
        FusedDecode.build(layers)
        or FusedMLADecode.build(layers)
        or FusedSegments.build(layers, _fusable, FusedDecode.build)
    )
