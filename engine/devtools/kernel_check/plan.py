"""Every kernel launch the supported models make on a GPU, recorded without one.

The launchers (calls.py) run on meta tensors under `planning_for(gpu)`, so
they choose tiles, dtypes and split counts exactly as on that GPU. While
they run, `JITFunction.run` is replaced by a recorder that binds the
arguments with Triton's own binder (the one `kernel[grid](...)` uses): the
pointer dtypes, the integers it specializes (a 1 becomes a constant, a
multiple of 16 gets a divisibility hint), the constexprs and the options
(warps, stages) are what a launch on the GPU would compile. Launches the
launcher configured alike are kept once (`_declared`), with the deployments
that use them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from engine.attention.triton.target import planning_for
from engine.devtools.kernel_check import calls
from engine.devtools.kernel_check.gpus import CheckedGPU, target
from engine.devtools.kernel_check.shapes import KV_DTYPES, EngineLimits, ModelShape, model_shapes

KERNEL_PACKAGES = ("engine.attention.triton", "engine.gpu_kernels")


@dataclass
class Launch:
    """One kernel specialization: what `triton.compile` takes, and who launches it."""

    kernel: Any  # the JITFunction
    signature: dict[str, str]
    constexprs: dict[tuple, Any]
    attrs: dict[tuple, Any]
    options: Any  # the backend's options (num_warps, num_stages, arch, ...)
    used_by: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.kernel.__name__

    @property
    def module(self) -> str:
        return self.kernel.fn.__module__

    def config(self) -> str:
        """The constexprs and launch options, as `NAME=value` words (dtypes short)."""
        names = self.kernel.arg_names
        words = []
        for path, value in sorted(self.constexprs.items()):
            if isinstance(path, tuple) and len(path) == 1 and names[path[0]].isupper():
                text = str(value).removeprefix("triton.language.")
                words.append(f"{names[path[0]]}={text}")
        words.append(f"warps={self.options.num_warps}")
        words.append(f"stages={self.options.num_stages}")
        return " ".join(words)

    def pointer_dtypes(self) -> str:
        return ",".join(v[1:] for v in self.signature.values() if v.startswith("*"))


class Recorder:
    """Stands in for JITFunction.run: binds and records each launch, runs nothing."""

    def __init__(self, gpu: CheckedGPU):
        from triton.compiler import make_backend

        self.backend = make_backend(target(gpu))
        self.launches: dict[str, Launch] = {}
        self.label = ""
        self._binders: dict[int, Any] = {}

    def record(self, kernel, args, kwargs) -> None:
        from triton.runtime.jit import create_function_from_signature

        binder = self._binders.get(id(kernel))
        if binder is None:
            binder = create_function_from_signature(kernel.signature, kernel.params, self.backend)
            self._binders[id(kernel)] = binder
        kwargs = dict(kwargs, debug=kwargs.get("debug", kernel.debug) or False)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(
            self.backend, kwargs, bound, specialization, options
        )
        key = repr((kernel.fn.__module__, kernel.__name__, _declared(kernel, signature, constexprs),
                    sorted(options.__dict__.items())))  # fmt: skip
        launch = self.launches.get(key)
        if launch is None:
            launch = self.launches[key] = Launch(kernel, signature, constexprs, attrs, options)
        if self.label not in launch.used_by:
            launch.used_by.append(self.label)


def _declared(kernel, signature: dict[str, str], constexprs: dict) -> list:
    """What the launcher chose: argument types, its tl.constexpr values.

    One compile per combination of these and the options. Triton's own
    specializations of plain integers (alignment hints, a 1 made a constant)
    are left out: other strides give the same tiles, and the first launch
    recorded (the smallest rows, the shortest step) stands for them all.
    """
    key = []
    for index, (param, kind) in enumerate(zip(kernel.params, signature.values(), strict=True)):
        if param.is_constexpr:
            key.append((param.name, repr(constexprs.get((index,)))))
        else:
            integer = kind == "constexpr" or kind[:1] in ("i", "u")  # i32, i64, a constant 1
            key.append((param.name, "int" if integer else kind))
    return key


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Within this block every `kernel[grid](...)` is recorded instead of launched."""
    from triton.runtime.jit import JITFunction

    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        recorder.record(self, args, kwargs)

    JITFunction.run = run
    try:
        yield recorder
    finally:
        JITFunction.run = original


def record_launches(gpu: CheckedGPU, calls_on_meta: Callable[[Recorder], None]) -> list[Launch]:
    """The launches `calls_on_meta(recorder)` makes on meta tensors, planned for `gpu`."""
    recorder = Recorder(gpu)
    with planning_for(gpu.planned), recording(recorder):
        calls_on_meta(recorder)
    return list(recorder.launches.values())


def plan_launches(
    gpu: CheckedGPU, shapes: list[ModelShape] | None = None, limits: EngineLimits | None = None
) -> list[Launch]:
    """The distinct kernel launches of every supported model on `gpu`.

    Per model: attention for each tensor-parallel degree and KV dtype (head
    counts per rank change the tiles), the packed linear and fused-MoE
    kernels for each weight form it is served in (their tiles depend on
    rows, not on the rank's slice of a weight, so tensor parallelism adds
    nothing to them), and the layer ops (norms, SwiGLU, rotary) in each
    activation dtype.
    """
    shapes = model_shapes() if shapes is None else shapes
    limits = EngineLimits.defaults() if limits is None else limits

    def every_model(recorder: Recorder) -> None:
        for shape in shapes:
            attention = calls.mla_attention if shape.attention == "mla" else calls.gqa_attention
            for tp in shape.tp_degrees():
                for kv in KV_DTYPES:
                    recorder.label = f"{shape.name} tp{tp} kv {kv}"
                    attention(shape, tp, kv, limits)
                    if shape.index_heads:
                        calls.dsa_decode(shape, tp, kv, limits)
            for form in shape.weight_forms:
                recorder.label = f"{shape.name} {form} weights"
                calls.packed_linears(shape, form, limits)
                calls.fused_moe(shape, form, limits)
            for dtype in calls.LAYER_OP_DTYPES:
                recorder.label = f"{shape.name} layer ops {str(dtype).removeprefix('torch.')}"
                calls.layer_ops(shape, dtype, limits)

    return record_launches(gpu, every_model)


def engine_kernels() -> dict[str, str]:
    """Every `*_kernel` jit function in the kernel packages: {module.name: name}.

    A kernel the plan never launches is a kernel nothing checks; the verdict
    says so. (Helpers that kernels call, like `load_as`, compile inside them.)
    """
    from triton.runtime.jit import JITFunction

    found = {}
    for package_name in KERNEL_PACKAGES:
        package = importlib.import_module(package_name)
        for info in pkgutil.iter_modules(package.__path__, package_name + "."):
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if isinstance(value, JITFunction) and value.__name__.endswith("_kernel"):
                    found[f"{value.fn.__module__}.{value.__name__}"] = value.__name__
    return found
