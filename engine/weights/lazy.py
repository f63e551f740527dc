"""Checkpoint tensors read only as far as they are needed.

A safetensors file maps its tensors into memory; `get_slice` reads a range
of rows or columns without touching the rest. A tensor-parallel rank asks
each `LazyTensor` for its slice (`narrow`), so its peak host memory during
load is its own weights plus one slice, never the whole checkpoint.
Anything that needs the whole tensor (quantized parts being decoded, KV
scales, replicated weights) calls `materialize`.
"""

from __future__ import annotations

import torch

# safetensors' dtype names -> torch dtypes, for code that checks a tensor's dtype unread.
_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


class LazyTensor:
    """One tensor of an open safetensors file; valid while the file is open."""

    def __init__(self, handle, name: str):
        self._handle = handle
        self._name = name
        self._slice = handle.get_slice(name)
        self.shape = torch.Size(self._slice.get_shape())
        self.dtype = _DTYPES.get(self._slice.get_dtype())

    def dim(self) -> int:
        return len(self.shape)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        """Rows (dim 0) or columns (dim 1) [start, start + length), read from the file."""
        if not 0 <= dim < len(self.shape):
            raise IndexError(f"{self._name}: dim {dim} of a {len(self.shape)}-d tensor")
        index = (slice(None),) * dim + (slice(start, start + length),)
        return self._slice[index]

    def load(self) -> torch.Tensor:
        return self._handle.get_tensor(self._name)

    def __repr__(self) -> str:
        return f"LazyTensor({self._name!r}, shape={tuple(self.shape)}, dtype={self.dtype})"


def materialize(tensor) -> torch.Tensor:
    """The whole tensor, read now (a torch.Tensor passes through)."""
    return tensor if isinstance(tensor, torch.Tensor) else tensor.load()
