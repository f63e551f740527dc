"""The kernels' weight kinds and format constants, and the input checks their wrappers share.

No Triton here: expert containers (moe_weights.py) and callers that only
validate or describe weights import this without the GPU stack.
"""

from __future__ import annotations

import torch

DENSE, FP8, INT4 = 0, 1, 2  # the `KIND` constexpr of the kernels
FP8_BLOCK = 128  # DeepSeek's block: activation groups and weight blocks along K and N
INT4_VALUES_PER_WORD = 8
# vLLM's epsilon: an all-zero activation group still gets a positive scale.
ACT_AMAX_EPS = 1e-10

FLOAT_ACTS = (torch.bfloat16, torch.float16, torch.float32)


def check_tensor(
    name: str, t: torch.Tensor, dims: int, dtypes: tuple[torch.dtype, ...], device: torch.device
) -> None:
    """A clear ValueError unless t has `dims` dimensions, one of `dtypes`, and lives on `device`."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        wanted = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} has dtype {t.dtype}, expected one of: {wanted}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the activations on {device}")


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...], why: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(expected)} ({why})")


def as_bytes(fp8: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn (or uint8) -> its uint8 bytes, innermost dimension dense."""
    raw = fp8.view(torch.uint8) if fp8.dtype != torch.uint8 else fp8
    return raw if raw.stride(-1) == 1 else raw.contiguous()


def dense_last(t: torch.Tensor) -> torch.Tensor:
    """t with a unit stride along its last dimension (kernels index columns directly)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
