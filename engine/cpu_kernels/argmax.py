"""torch.argmax(logits, -1) for float32 CPU logits, in C (argmax.c), where the kernels run."""

from __future__ import annotations

import torch

from engine.cpu_kernels.library import library, unavailable


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Index of each row's first maximum (or first NaN), int64 [rows]."""
    if (
        logits.dim() != 2
        or logits.dtype != torch.float32
        or logits.device.type != "cpu"
        or not logits.is_contiguous()
        or logits.shape[1] == 0
        or unavailable()
    ):
        return logits.argmax(-1)
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    library().argmax_rows(
        logits.data_ptr(), logits.shape[0], logits.shape[1], out.data_ptr(), torch.get_num_threads()
    )
    return out
