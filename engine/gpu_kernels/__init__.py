"""Triton kernels: GEMMs for weights kept in their checkpoint's precision (issue 16, GPU side),
and a decoder layer's small operators (issue 28).

Importing this package does not import Triton (see engine.attention.triton for
`triton_available()` and `interpreting()`). One kernel per module:

- w4a16:         activations [M, K] x INT4 group-quantized weights (compressed-tensors
                 pack-quantized: int32 [N, K/8], low nibble first, value + 8)
- fp8_act_quant: activations -> e4m3 per token in groups of 128 (DeepSeek's recipe),
                 a Triton kernel and the torch reference
- fp8_block:     e4m3 activations x e4m3 weights with 128x128 block scales -> BF16
- moe_align:     (token, slot) pairs sorted by expert into padded blocks (torch ops,
                 no host synchronisation)
- fused_moe:     one grouped GEMM over all experts for gate/up (SiLU(gate) * up in the
                 epilogue), one for down (routing weight in the epilogue), then the
                 per-token sum; BF16, FP8-block and INT4 experts
- common:        the tile loaders the three GEMMs share (one place per weight format)
- layer_ops:     a decoder layer's small operators, one kernel each: RMSNorm (with the
                 residual add), SwiGLU and rotary (engine/layers/gpu_layer_ops.py calls them)
- layout:        weight kinds, format constants and input checks (no Triton import)

docs/GPU_KERNELS.md describes layouts, tile choices and tolerances.
"""

from __future__ import annotations

from engine.attention.triton import interpreting, triton_available

__all__ = ["interpreting", "triton_available"]
