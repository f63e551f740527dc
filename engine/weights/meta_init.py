"""Build a model without memory for its parameters, then give each its storage.

While `parameters_on_meta()` is active, every parameter a module registers
lands on the meta device (shape and dtype only); buffers stay real, because
modules compute them at construction (rotary tables) and no checkpoint
holds them. Linear layers skip their random initialisation (the checkpoint
overwrites it; the empty tensor they allocate first is never touched, so it
costs no memory). `materialize_parameters` then allocates each parameter,
uninitialised, on the target device in its final dtype; the loader fills
them one checkpoint tensor at a time. Untouched pages of an empty CPU
tensor cost nothing until written, so host memory grows with what is loaded.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def parameters_on_meta():
    original = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    def skip(self) -> None:
        pass

    skipped = (nn.Linear, nn.Embedding)
    resets = [cls.reset_parameters for cls in skipped]
    nn.Module.register_parameter = register_on_meta
    for cls in skipped:
        cls.reset_parameters = skip
    try:
        yield
    finally:
        nn.Module.register_parameter = original
        for cls, reset in zip(skipped, resets, strict=True):
            cls.reset_parameters = reset


def materialize_parameters(model: nn.Module, device: torch.device) -> None:
    """Storage for every meta parameter, keeping parameters that are shared (tied) shared."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.device.type != "meta":
                continue
            real = made.get(id(param))
            if real is None:
                real = nn.Parameter(
                    torch.empty(param.shape, dtype=param.dtype, device=device),
                    requires_grad=False,
                )
                made[id(param)] = real
            module._parameters[name] = real
