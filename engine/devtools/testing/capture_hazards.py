"""Find, on CPU, the operations that would break a CUDA-graph capture of the same code on a GPU.

Inside a CUDA-graph capture, an operation that waits for the device (reads a
value back: `.item()`, `bool(t)`, an output size that depends on the data)
either raises or bakes the value it read into the graph, and a copy of host
data made per call is replayed with the host data of the capture. Those
operations are the same aten operators on CPU tensors as on CUDA ones, so
running the code once under `CaptureHazards` on CPU names every one of them
without a GPU:

    with CaptureHazards() as hazards:
        step(batch)
    assert hazards.found == []          # or: capture_hazards(step, batch) == []

Each entry of `found` is the operator and why it is a hazard, in the order
they ran, e.g. "aten.bincount.default: output size read from the device".

Two interception points, because some host reads never reach aten:
- a TorchDispatchMode (this class) sees aten operators after Python-level
  decomposition (`torch.argwhere` arrives as `aten.nonzero`, `float(t)` and
  `t.is_nonzero()` as `aten._local_scalar_dense`);
- a companion TorchFunctionMode sees the Tensor methods that copy to the host
  without an aten operator on a CPU tensor (`tolist`, `numpy`, `__array__`,
  `cpu`), and marks `t[i] = 3.0`: on CPU the Python scalar arrives as a
  lifted 0-dim tensor (`aten.lift_fresh`, which is otherwise what
  `torch.tensor(data)` looks like), while on CUDA it is a device-side fill,
  no host copy; that one lift is not a hazard.

Triton kernels under TRITON_INTERPRET=1: Triton 3.9's interpreter copies
kernel arguments through untyped storages and `set_` (no hazard operator,
and all on one device), then runs the kernel body in numpy. Older releases
moved arguments with `tensor.cpu()` and a copy back, which would read as
host copies. Whatever a release does, anything issued while a frame of
`triton.runtime.interpreter` is on the Python stack belongs to the
interpreter standing in for a GPU, not to the code under test, so it is not
recorded (the stack is only walked for an operator that is a hazard, so
this costs nothing per ordinary operator).

Limits: only what runs is seen (a branch not taken is not checked); a
`.to(device)` whose source and target are both CPU (the code under test
moving data to "the device" on a CPU machine) cannot be told from a no-op.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

DEVICE_READ = "value read back from the device (a host synchronisation)"
DATA_SIZED = "output size read from the device"
HOST_DATA = "Python data copied to the device on every call (torch.tensor(...), a list index)"

# Operators that are hazards whatever their arguments, with the reason.
ALWAYS: dict[object, str] = {
    aten._local_scalar_dense.default: DEVICE_READ + " (item, float, int, bool, if t)",
    # Under torch.inference_mode (the engine's forward) item/float/int arrive undecomposed.
    aten.item.default: DEVICE_READ + " (item, float, int under inference_mode)",
    aten.is_nonzero.default: DEVICE_READ,
    aten.equal.default: DEVICE_READ + " (a Python bool)",
    aten.allclose.default: DEVICE_READ + " (a Python bool)",
    aten.nonzero.default: DATA_SIZED,
    aten.argwhere.default: DATA_SIZED,
    aten.bincount.default: DATA_SIZED,
    aten.unique_consecutive.default: DATA_SIZED,
    aten.unique_dim.default: DATA_SIZED,
    aten.unique_dim_consecutive.default: DATA_SIZED,
    aten._unique.default: DATA_SIZED,
    aten._unique2.default: DATA_SIZED,
    aten.masked_select.default: DATA_SIZED,
    aten.lift_fresh.default: HOST_DATA,
    aten.lift_fresh_copy.default: HOST_DATA,
}
BOOL_INDEXED = (aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                aten._index_put_impl_.default)  # fmt: skip
REPEAT_INTERLEAVE = (aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor)

# Tensor methods that copy to the host without an aten operator on a CPU tensor.
HOST_METHODS = {
    torch.Tensor.tolist: "copies the tensor to the host (a Python list)",
    torch.Tensor.numpy: "copies the tensor to the host (a numpy array)",
    torch.Tensor.__array__: "copies the tensor to the host (a numpy array)",
    torch.Tensor.cpu: "copies the tensor to the host",
}
PYTHON_SCALARS = (bool, int, float, complex)
INTERPRETER_MODULE = "triton.runtime.interpreter"


class CaptureHazards(TorchDispatchMode):
    """Records, in `found`, each operation run under it that a CUDA-graph capture cannot hold."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []
        self._python_side = _PythonSideReads(self)
        # Python-scalar values of `t[...] = x` being assigned; the next 0-dim lift is theirs.
        self.scalar_assignments = 0

    def __enter__(self):
        self._python_side.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._python_side.__exit__(*sys.exc_info())
            raise

    def __exit__(self, exc_type, exc, tb):
        try:
            return super().__exit__(exc_type, exc, tb)
        finally:
            self._python_side.__exit__(exc_type, exc, tb)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = self._hazard(func, args, kwargs)
        if reason is not None:
            self.record(str(func), reason)
        return func(*args, **kwargs)

    def record(self, name: str, reason: str) -> None:
        if not _issued_by_triton_interpreter():
            self.found.append(f"{name}: {reason}")

    def _hazard(self, func, args, kwargs) -> str | None:
        if func in ALWAYS:
            if func is aten.lift_fresh.default and self._is_assigned_scalar(args[0]):
                return None
            return ALWAYS[func]
        if func in BOOL_INDEXED:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(_is_mask(i) for i in indices):
                return "boolean-mask indexing: " + DATA_SIZED + " (use where/masked_fill)"
            return None
        if func in REPEAT_INTERLEAVE:
            if kwargs.get("output_size") is None:
                return "Tensor repeats without output_size: " + DATA_SIZED
            return None
        if func is aten.histc.default:
            low, high = (_argument(func, args, kwargs, name, 0) for name in ("min", "max"))
            if low == high:  # no range given: the data's min and max are read back
                return DEVICE_READ + " (histc without a range)"
            return None
        if func is aten._to_copy.default:
            target = kwargs.get("device")
            if target is not None and torch.device(target) != args[0].device:
                return f"copies between devices ({args[0].device} -> {torch.device(target)})"
            return None
        if func in (aten.copy_.default, aten.copy.default):
            dst, src = args[0], args[1]
            if isinstance(src, torch.Tensor) and src.device != dst.device:
                return f"copies between devices ({src.device} -> {dst.device})"
        return None

    def _is_assigned_scalar(self, lifted: torch.Tensor) -> bool:
        """Whether this lift is the value of a `t[...] = <Python scalar>` (a device fill on CUDA)."""
        if self.scalar_assignments and lifted.dim() == 0:
            self.scalar_assignments -= 1
            return True
        return False


class _PythonSideReads(TorchFunctionMode):
    """The host reads and scalar assignments that aten does not show (see the module doc)."""

    def __init__(self, hazards: CaptureHazards):
        super().__init__()
        self.hazards = hazards

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_METHODS:
            self.hazards.record(f"Tensor.{func.__name__}", HOST_METHODS[func])
        if func is torch.Tensor.__setitem__ and isinstance(args[2], PYTHON_SCALARS):
            before = self.hazards.scalar_assignments
            self.hazards.scalar_assignments = before + 1
            try:
                return func(*args, **kwargs)
            finally:
                self.hazards.scalar_assignments = before
        return func(*args, **kwargs)


def capture_hazards(fn: Callable, *args, **kwargs) -> list[str]:
    """Run fn(*args, **kwargs) once under CaptureHazards and return what it found."""
    with CaptureHazards() as hazards:
        fn(*args, **kwargs)
    return hazards.found


def _argument(func, args, kwargs, name: str, default):
    """An operator's argument by its schema name, passed by position or by keyword."""
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return args[position] if position < len(args) else kwargs.get(name, default)
    return default


def _is_mask(index) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _issued_by_triton_interpreter() -> bool:
    """Whether Triton's CPU interpreter is on the Python stack (its work stands in for a GPU's)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == INTERPRETER_MODULE:
            return True
        frame = frame.f_back
    return False
