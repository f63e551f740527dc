"""All decoder layers of a DeepSeek V3 / Kimi K2 decode step in one C call
(engine/cpu_kernels/decode_mla_layers.c).

The Kimi and DeepSeek trunk is the Llama one (PreNormDecoderLayer) with MLA
attention and a MoE or dense feed-forward. On CPU with grid weights each
module is already a C kernel (grid products, the C layer ops, the MLA decode
kernel, the MoE layer's C call), joined by Python: module calls, views,
argument checks and ctypes conversions, about half of a Kimi-shaped step at
one row. `FusedMLADecode` describes the model to C once (weight pointers,
shapes, the pool's scales) and is the trunk's `decode_step`, as FusedDecode
(engine/models/cpu_decode_step.py) is for the Llama family: the same kernels
in the same order, so the step computes what the modules compute. Steps it
does not cover (prefill, more rows than the MoE layer's C call takes, another
backend, a pool still calibrating or observing) run the modules. One
tensor-parallel rank only: it runs no collectives.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from engine.attention.cpu_backend import CPUAttentionBackend
from engine.cpu_kernels.grid_matmul import GridWeightRef
from engine.cpu_kernels.library import library
from engine.cpu_kernels.paged_decode import KV_KINDS
from engine.kv.rotation import HadamardRotation
from engine.layers.cpu_grid_weights import GridWeight, grid_weight_of
from engine.layers.moe import SparseMoE
from engine.models.decoder import GatedMLP, PreNormDecoderLayer
from engine.models.deepseek_v3 import MLAAttention

_PTR, _I64, _FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_NONE = GridWeightRef()  # codes NULL: no such weight


class _Layer(ctypes.Structure):
    _fields_ = [
        *((name, _PTR) for name in ("input_norm", "post_norm", "q_a_norm", "kv_a_norm")),
        *((name, GridWeightRef) for name in ("qkv_a", "q_b", "o", "k_b", "v_b")),
        ("kv_b", _PTR),
        ("gain", _PTR),
        ("rows", _PTR),
        *((name, _FLOAT) for name in ("latent_scale", "rope_scale")),
        *((name, _FLOAT) for name in ("latent_factor", "rope_factor")),
        ("routing", _PTR),
        ("experts", _PTR),
        *((name, _I64) for name in ("gate_up_format", "down_format", "expert_intermediate")),
        ("gate_up", GridWeightRef),
        ("down", GridWeightRef),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        *((name, _I64) for name in ("hidden", "heads", "q_lora", "nope", "rope", "v", "r")),
        *((name, _I64) for name in ("latent_block", "rope_block", "interleaved", "kv_kind")),
        ("cos", _PTR),
        ("sin", _PTR),
        ("eps", _FLOAT),
        ("softmax_scale", _FLOAT),
    ]


def _grid(linear: nn.Module | None) -> GridWeight | None:
    packed = grid_weight_of(linear) if linear is not None else None
    return packed if isinstance(packed, GridWeight) else None


def _block(rotation) -> int | None:
    """The Hadamard block the C code applies (0: none), or None for one it cannot."""
    if rotation is None:
        return 0
    if not isinstance(rotation, HadamardRotation) or rotation.batch_invariant:
        return None
    block = rotation.block
    return block if 16 <= block <= 1024 and not block & (block - 1) else None


def _attention_fusable(attn, first) -> bool:
    if type(attn) is not MLAAttention or not attn.q_lora_rank or attn.path != "auto":
        return False
    dims = attn.dims
    grid = attn.latent_grid
    weights_ok = (
        grid.fits(dims.num_heads, dims.nope_dim, dims.v_dim, dims.lora_rank)
        if grid is not None
        else attn.kv_b_proj.weight.dtype == torch.bfloat16 and attn.kv_b_proj.weight.is_contiguous()
    )
    norms = (attn.q_a_layernorm, attn.kv_a_layernorm)
    return (
        all(_grid(m) is not None for m in (attn.fused_qkv_a_proj, attn.q_b_proj, attn.o_proj))
        and all(n.weight.dtype == torch.bfloat16 for n in norms)
        and weights_ok
        and dims == first.dims
        and attn.q_lora_rank == first.q_lora_rank
        and attn.rotary is first.rotary
        and attn.scale == first.scale
        and _block(attn.latent_rotation) == _block(first.latent_rotation) is not None
        and _block(attn.rope_rotation) == _block(first.rope_rotation) is not None
        and dims.lora_rank % 16 == 0
        and dims.rope_dim % 16 == 0
    )


def _mlp_fusable(mlp) -> bool:
    if isinstance(mlp, SparseMoE):
        return mlp.cpu_block is not None
    return type(mlp) is GatedMLP and all(
        _grid(m) is not None for m in (mlp.gate_up_proj, mlp.down_proj)
    )


def _fusable(layer, first_layer) -> bool:
    if type(layer) is not PreNormDecoderLayer:
        return False
    eps = first_layer.input_layernorm.eps
    attn = layer.self_attn
    norms = (
        layer.input_layernorm,
        layer.post_attention_layernorm,
        getattr(attn, "q_a_layernorm", None),
        getattr(attn, "kv_a_layernorm", None),
    )
    return (
        _attention_fusable(attn, first_layer.self_attn)
        and _mlp_fusable(layer.mlp)
        and all(n is not None and n.weight.dtype == torch.bfloat16 and n.eps == eps for n in norms)
    )


class FusedMLADecode:
    """The layers of one model, described for `decode_mla_layers`; `run` takes a decode step."""

    def __init__(self, layers: list[PreNormDecoderLayer]):
        attn = layers[0].self_attn
        dims = attn.dims
        self.layers = layers
        self.mlp_width = max(
            (
                _grid(layer.mlp.gate_up_proj).rows // 2
                for layer in layers
                if type(layer.mlp) is GatedMLP
            ),
            default=0,
        )
        self.moe_blocks = [
            layer.mlp.cpu_block for layer in layers if isinstance(layer.mlp, SparseMoE)
        ]
        self.model = _Model(
            hidden=layers[0].input_layernorm.weight.numel(),
            heads=dims.num_heads,
            q_lora=attn.q_lora_rank,
            nope=dims.nope_dim,
            rope=dims.rope_dim,
            v=dims.v_dim,
            r=dims.lora_rank,
            latent_block=_block(attn.latent_rotation),
            rope_block=_block(attn.rope_rotation),
            interleaved=int(attn.rotary.interleaved),
            cos=attn.rotary.cos.data_ptr(),
            sin=attn.rotary.sin.data_ptr(),
            eps=layers[0].input_layernorm.eps,
            softmax_scale=attn.scale,
        )
        self._scales_key: tuple = (None, -1)
        self._array = None
        self._keep: list = []  # tensors the array points into

    @classmethod
    def build(cls, layers) -> FusedMLADecode | None:
        """The fused form when every layer is one the C code implements, else None."""
        if not layers or not all(_fusable(layer, layers[0]) for layer in layers):
            return None
        rotary = layers[0].self_attn.rotary
        if not (
            rotary.cos.dtype == torch.float32
            and rotary.cos.is_contiguous()
            and rotary.sin.is_contiguous()
            and rotary.rotary_dim == layers[0].self_attn.dims.rope_dim
        ):
            return None
        return cls(layers)

    def _layer(self, index: int, layer, pool) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        grid = attn.latent_grid
        gain = None
        if grid is not None and grid.gain is not None:
            gain = grid.gain.float().contiguous()
            self._keep.append(gain)
        latent_factor, rope_factor = pool.dequant_factors(index)
        ffn = {}
        if isinstance(mlp, SparseMoE):
            block = mlp.cpu_block
            experts = block.experts
            ffn = dict(
                routing=ctypes.addressof(block.routing),
                experts=ctypes.addressof(experts.experts),
                gate_up_format=int(experts.gate_up_format),
                down_format=int(experts.down_format),
                expert_intermediate=experts.intermediate,
                gate_up=block.shared_gate_up or _NONE,
                down=block.shared_down or _NONE,
            )
        else:
            ffn = dict(
                gate_up=GridWeightRef.of(_grid(mlp.gate_up_proj)),
                down=GridWeightRef.of(_grid(mlp.down_proj)),
            )
        return _Layer(
            input_norm=layer.input_layernorm.weight.data_ptr(),
            post_norm=layer.post_attention_layernorm.weight.data_ptr(),
            q_a_norm=attn.q_a_layernorm.weight.data_ptr(),
            kv_a_norm=attn.kv_a_layernorm.weight.data_ptr(),
            qkv_a=GridWeightRef.of(_grid(attn.fused_qkv_a_proj)),
            q_b=GridWeightRef.of(_grid(attn.q_b_proj)),
            o=GridWeightRef.of(_grid(attn.o_proj)),
            k_b=GridWeightRef.of(grid.k_b) if grid is not None else _NONE,
            v_b=GridWeightRef.of(grid.v_b) if grid is not None else _NONE,
            kv_b=attn.kv_b_proj.weight.data_ptr() if grid is None else None,
            gain=None if gain is None else gain.data_ptr(),
            rows=pool.storage[index].data_ptr(),
            latent_scale=float(pool.latent_scale[index]),
            rope_scale=float(pool.rope_scale[index]),
            latent_factor=latent_factor,
            rope_factor=rope_factor,
            **ffn,
        )

    def run(self, x: torch.Tensor, positions: torch.Tensor, ctx) -> bool:
        """Run every layer on x [tokens, hidden] in place; False (x untouched) if not fusable."""
        meta, pool = ctx.meta, ctx.pool
        if not (
            meta.decode_only
            and type(ctx.backend) is CPUAttentionBackend
            and x.dtype == torch.bfloat16
            and x.is_contiguous()
            and x.device.type == "cpu"
            and hasattr(pool, "dequant_factors")
            and getattr(pool, "storage", None) is not None
            and pool.storage.dtype in KV_KINDS
            and pool.storage.shape[0] == len(self.layers)
            and all(block.takes(x) for block in self.moe_blocks)
        ):
            return False
        if not pool.writes_plainly():  # still calibrating or observing: the modules write
            return False
        if (pool, pool.scales_version) != self._scales_key:
            self._keep = []
            layers = [self._layer(i, layer, pool) for i, layer in enumerate(self.layers)]
            self._array = (_Layer * len(layers))(*layers)
            self._scales_key = (pool, pool.scales_version)
            self.model.kv_kind = KV_KINDS[pool.storage.dtype]
        # Held here: the C call reads them through their pointers.
        positions = positions.to(torch.int64).contiguous()
        lengths = meta.context_lengths()
        status = library().decode_mla_layers(
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
            self.mlp_width,
            torch.get_num_threads(),
        )
        if status != 0:
            raise MemoryError("decode_mla_layers could not allocate its scratch or run a kernel")
        return True
