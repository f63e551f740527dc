"""The GPU a launch is sized for: the tensors' own CUDA device, or one the compile check names.

Launchers choose tiles, dot dtypes and split counts from the GPU they run
on (its compute capability and SM count). The compile check
(engine/devtools/kernel_check) runs the same launchers on meta tensors, which have
no GPU, inside `planning_for(...)`: there a meta tensor stands for a tensor
on the named GPU, so the check compiles exactly what a launch on that GPU
would, from the launchers' own code rather than a copy of their choices.
Outside `planning_for`, meta and CPU tensors mean "no GPU" (the interpreter).
Importing this module does not import Triton.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

INTERPRETER_SMS = 4  # the interpreter has no GPU to ask; small, like the test shapes


@dataclass(frozen=True)
class PlannedGPU:
    """What the launchers need to know about a GPU they cannot see."""

    name: str
    capability: tuple[int, int]
    sms: int


_PLANNED: ContextVar[PlannedGPU | None] = ContextVar("planned_gpu", default=None)
_SM_COUNTS: dict[int, int] = {}


@contextmanager
def planning_for(gpu: PlannedGPU) -> Iterator[PlannedGPU]:
    """Within this block, meta tensors stand for tensors on `gpu`."""
    token = _PLANNED.set(gpu)
    try:
        yield gpu
    finally:
        _PLANNED.reset(token)


def _planned(device: torch.device) -> PlannedGPU | None:
    return _PLANNED.get() if device.type == "meta" else None


def on_gpu(t: torch.Tensor) -> bool:
    """Whether t lives on a GPU: a CUDA tensor, or a meta tensor while planning for one."""
    return t.is_cuda or _planned(t.device) is not None


def capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of the GPU behind `device`; None when there is none."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)
    planned = _planned(device)
    return planned.capability if planned is not None else None


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of the GPU behind `device` (INTERPRETER_SMS without one)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in _SM_COUNTS:
            _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
        return _SM_COUNTS[index]
    planned = _planned(device)
    return planned.sms if planned is not None else INTERPRETER_SMS
