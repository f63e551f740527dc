"""Which weight format a checkpoint uses, from its `quantization_config`, and the decoder for it.

- none: plain bf16/fp16/fp32 tensors, loaded as they are;
- `quant_method: fp8` with `weight_block_size`: FP8 block-quantized
  (DeepSeek V3, Kimi K2 and K2-Instruct-0905 releases);
- `quant_method: compressed-tensors`, `format: pack-quantized`: INT4 experts
  (Kimi K2-Thinking, K2.5, K2.6).
Anything else is refused by name rather than loaded wrong.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from engine.errors import UnsupportedModelError
from engine.model_files.model_config import ModelConfig
from engine.weights.fp8_block_format import Fp8BlockDecoder
from engine.weights.int4_packed import PackedInt4Decoder, PackedInt4Scheme
from engine.weights.parts import Tensors

SUPPORTED = "fp8 with weight_block_size (FP8 block), compressed-tensors pack-quantized (INT4)"


class PlainWeights:
    """No quantization: tensors pass through."""

    format_name = "plain"

    def stream(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> Tensors:
        yield from tensors


def weight_decoder(cfg: ModelConfig, dtype: torch.dtype, name_prefix: str = ""):
    """The decoder for this checkpoint's weight format, producing plain weights in `dtype`."""
    qc = cfg.quantization
    if not qc:
        return PlainWeights()
    method = qc.get("quant_method")
    if method == "fp8":
        block = qc.get("weight_block_size")
        if not block:
            raise UnsupportedModelError(
                "quantization_config: per-tensor FP8 weights (fp8 without weight_block_size) "
                f"are not supported; supported: {SUPPORTED}"
            )
        if qc.get("fmt", "e4m3") != "e4m3":
            raise UnsupportedModelError(f"quantization_config: FP8 fmt {qc['fmt']!r}; only e4m3")
        if len(block) != 2:
            raise UnsupportedModelError(
                f"quantization_config.weight_block_size {block}: expected [rows, cols]"
            )
        return Fp8BlockDecoder((int(block[0]), int(block[1])), dtype)
    if method == "compressed-tensors":
        return PackedInt4Decoder(PackedInt4Scheme.from_quantization_config(qc), dtype, name_prefix)
    raise UnsupportedModelError(
        f"quantization_config.quant_method {method!r} is not supported; supported: {SUPPORTED}"
    )
