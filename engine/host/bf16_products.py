"""BF16 products on CPUs where torch has no BF16 matrix kernel.

Without AVX-512 BF16 (AMD Zen 1-3, Intel client cores) torch multiplies BF16
matrices row by row with a dot-product kernel: its time grows with every row,
where float32's GEMM reuses each weight across rows. On 2 Zen 3 cores a
[2048, 512] x [512, 4096] product (Kimi's kv_b_proj over a 2,048-token prefill)
took 600 ms in BF16 and 89 ms in float32, the casts included; over 14 layers
that was 40% of the prefill. From `FLOAT32_FROM_ROWS` rows on, such products
run in float32 and are rounded to BF16 once, as the BF16 kernel rounds its
float32 sums: the same values up to the order of the sums. Fewer rows stay in
BF16, where casting the weight would cost more than the product (one row of a
[32000, 2048] head: 7 ms in BF16, 113 ms through float32).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

FLOAT32_FROM_ROWS = 32  # measured break-even: 16-20 rows


@functools.cache
def torch_bf16_products_are_slow() -> bool:
    """Whether this CPU lacks the BF16 support torch's oneDNN matrix kernels need."""
    try:
        return not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        return False


def _slow_bf16_pair(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Both operands BF16 on a CPU where torch multiplies BF16 slowly."""
    return (
        x.dtype == torch.bfloat16
        and weight.dtype == torch.bfloat16
        and x.device.type == "cpu"
        and torch_bf16_products_are_slow()
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """F.linear, through float32 for many BF16 rows on a CPU without BF16 kernels."""
    if x.numel() >= FLOAT32_FROM_ROWS * x.shape[-1] and _slow_bf16_pair(x, weight):
        bias = None if bias is None else bias.float()
        return F.linear(x.float(), weight.float(), bias).to(torch.bfloat16)
    return F.linear(x, weight, bias)


def einsum(equation: str, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """torch.einsum of two operands, through float32 whenever both are BF16 on a CPU
    without BF16 kernels: there torch's batched BF16 products are slower still than
    its row-by-row linear, at any row count. MLA's absorbed path (a prefill chunk over
    a cached prefix) on a Kimi-shaped layer, 16 heads: 2.6 ms in BF16 against 0.6
    through float32 for one token, 59 against 2.2 for 32 tokens (2 Zen 3 cores); it
    was most of a follow-up turn's prefill there. Rounded to BF16 once."""
    if _slow_bf16_pair(x, weight):
        return torch.einsum(equation, x.float(), weight.float()).to(torch.bfloat16)
    return torch.einsum(equation, x, weight)
