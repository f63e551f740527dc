"""Attention backends by name: the one place the engine, its CLI and its server find them.

The names and what each is are declared in engine/attention/names.py (torch-free,
so the config and `--help` read them); here each name is bound to its factory,
and `get_backend` turns a name into a backend for the device the model runs on.
The Triton backend is imported only when chosen: Triton is an optional
dependency (Linux x86-64), and importing it costs a second.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.attention import triton as triton_support
from engine.attention.cpu_backend import CPUAttentionBackend
from engine.attention.deterministic import DeterministicAttentionBackend
from engine.attention.names import BACKEND_NAMES
from engine.attention.torch_backend import TorchAttentionBackend
from engine.cpu_kernels import library
from engine.errors import EngineError

# `library` and `triton_support` are read through the module at each call, so a
# test can make either unavailable.


def _torch(_on_cuda: bool | None):
    return TorchAttentionBackend()


def _cpu_required(_on_cuda: bool | None):
    reason = library.unavailable()
    if reason:
        raise EngineError(
            f"attention backend 'cpu' cannot run here: {reason}; use --attention-backend torch"
        )
    return CPUAttentionBackend()


def _cpu_or_torch():
    """The CPU backend (C decode kernel), or the torch one where its kernels cannot run."""
    return TorchAttentionBackend() if library.unavailable() else CPUAttentionBackend()


def _triton_backend(**kwargs):
    from engine.attention.triton.backend import TritonAttentionBackend  # imports Triton

    return TritonAttentionBackend(**kwargs)


def _triton(on_cuda: bool | None):
    if not triton_support.triton_available():
        raise EngineError(
            "attention backend 'triton' needs the triton package (pip install triton); "
            "use --attention-backend torch"
        )
    if not triton_support.interpreting() and not _cuda(on_cuda):
        raise EngineError(
            "attention backend 'triton' runs on a CUDA GPU (or under TRITON_INTERPRET=1 for "
            "tests); this engine runs on CPU: use --attention-backend torch or auto"
        )
    return _triton_backend()


def _auto(on_cuda: bool | None):
    if not _cuda(on_cuda):
        return _cpu_or_torch()
    if not triton_support.triton_available():
        return TorchAttentionBackend()
    return _triton_backend(fallback=TorchAttentionBackend())


def _cuda(on_cuda: bool | None) -> bool:
    return on_cuda if on_cuda is not None else torch.cuda.is_available()


# Each declared name's factory: (model on CUDA, or None when the caller did not say)
# -> a backend. In BACKEND_NAMES' order.
_FACTORIES: dict[str, Callable[[bool | None], object]] = {
    "auto": _auto,
    "torch": _torch,
    "cpu": _cpu_required,
    "triton": _triton,
}
assert set(_FACTORIES) == set(BACKEND_NAMES), "every declared backend name needs a factory"
BACKENDS = {name: _FACTORIES[name] for name in BACKEND_NAMES}


def get_backend(name: str, deterministic: bool = False, device: torch.device | str | None = None):
    """The attention backend called `name` for a model on `device`.

    Without `device`, "auto" asks whether CUDA is available (and the torch
    backend takes CPU tensors at run time). Deterministic mode has its own
    reduction order (engine.attention.deterministic), which "auto" and
    "torch" use; the Triton kernels do not provide it.
    """
    if name not in BACKENDS:
        raise EngineError(f"attention backend {name!r}: use one of {', '.join(BACKENDS)}")
    if name == "triton" and deterministic:
        raise EngineError(
            "--deterministic needs the batch-invariant torch reductions; "
            "use --attention-backend torch or auto with it"
        )
    if deterministic:
        return DeterministicAttentionBackend()
    on_cuda = torch.device(device).type == "cuda" if device is not None else None
    return BACKENDS[name](on_cuda)
