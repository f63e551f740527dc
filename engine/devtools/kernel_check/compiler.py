"""Compile one planned launch for one GPU and read what its cubin uses; cache the answer.

Registers and spills come from the cubin (`cuobjdump --dump-resource-usage`,
shipped in Triton's wheel). Triton kernels call no functions and keep no
local arrays, so any per-thread local memory is spilled registers: ptxas
puts spills in the stack frame (STACK; `ptxas -v` says "136 bytes stack
frame, 252 bytes spill stores" for the same W4A16 cubin) or in LOCAL, and
`spilled` is the sum. Shared memory is Triton's own figure (`metadata.shared`, the
dynamic shared memory it asks for at launch and checks against the device's
limit).

Compiling is the slow part (about a second a kernel on one core), so each
answer is kept under $XDG_CACHE_HOME/resident/kernel-check, keyed like
Triton's own cache: the Triton version, the kernel's source with everything
it calls (`JITFunction.cache_key`), the specialization, the options and
ptxas's version. A changed kernel misses the cache; an unchanged one costs
nothing. Failed compiles are not cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from engine.devtools.kernel_check.gpus import CheckedGPU, cuobjdump_path, target
from engine.devtools.kernel_check.plan import Launch

CACHE_VERSION = 3  # bump when the cached record's fields change
_PLAIN_GLOBAL = re.compile(r"Cannot access global variable (\w+)")
_RESOURCE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def cache_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "resident" / "kernel-check"


def _source(launch: Launch):
    from triton.compiler import ASTSource

    return ASTSource(launch.kernel, launch.signature, launch.constexprs, launch.attrs)


def cache_key(launch: Launch, gpu: CheckedGPU) -> str:
    import triton
    from triton.compiler import make_backend

    backend = make_backend(target(gpu))
    options = backend.parse_options(dict(launch.options.__dict__))
    text = "-".join(
        [str(CACHE_VERSION), triton.__version__, _source(launch).hash(), backend.hash(),
         options.hash()]
    )  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()


_MMA_FORMS = (
    # Hopper: warpgroup MMA, shape and the A/B operand types.
    (re.compile(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.\w+\.(\w+)\.(\w+)"), "wgmma"),
    # Ampere-style warp MMA (also what Hopper runs for dots of fewer than 64 rows).
    (
        re.compile(r"mma\.sync\.aligned\.(m\d+n\d+k\d+)\.row\.col\.\w+\.(\w+)\.(\w+)"),
        "mma.sync",
    ),
    # Blackwell: tensor-memory MMA, named by its operand kind (f8f6f4: the 8/6/4-bit floats).
    (re.compile(r"tcgen05\.mma\.cta_group::\d\.kind::(\w+)"), "tcgen05.mma"),
)


def tensor_core_ops(ptx: str) -> list[str]:
    """The tensor-core instructions a kernel's PTX uses, one entry per distinct form:
    "wgmma m64n16k32 e4m3.e4m3", "mma.sync m16n8k16 f16.f16", "tcgen05.mma f8f6f4"."""
    found = set()
    for pattern, name in _MMA_FORMS:
        for match in pattern.finditer(ptx):
            groups = match.groups()
            operands = ".".join(groups[1:]) if len(groups) > 1 else ""
            found.add(" ".join(part for part in (name, groups[0], operands) if part))
    return sorted(found)


def cubin_resources(cubin: bytes) -> dict[str, int]:
    """Registers per thread, spilled bytes per thread (stack + local), static shared bytes."""
    tool = cuobjdump_path()
    if tool is None:
        raise RuntimeError("cuobjdump is missing from the Triton wheel; cannot read registers")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([tool, "--dump-resource-usage", str(path)], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    match = _RESOURCE.search(out)
    if match is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{out}")
    registers, stack, static_shared, local = (int(v) for v in match.groups())
    return dict(registers=registers, spilled=stack + local, stack=stack, local=local,
                static_shared=static_shared)  # fmt: skip


def summarize_error(exc: BaseException) -> str:
    """One line: what Triton said went wrong and where in the kernel.

    Triton's CompilationError prints the kernel's source around the fault
    and ends with the error itself; the first line says where ("at 43:32:").
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    where = lines[0].rstrip(":") if lines[0].startswith("at ") and len(lines) > 1 else ""
    what = lines[-1]
    plain_global = _PLAIN_GLOBAL.search(what)
    if plain_global:  # Triton's message runs on; name the variable and the fix
        what = (f"Cannot access global variable {plain_global.group(1)}: a module global read "
                "inside a kernel must be a tl.constexpr(...)")  # fmt: skip
    return f"{what} ({where})" if where else what


def _check_compiler_mode() -> None:
    """Refuse to compile in a process that imported Triton under TRITON_INTERPRET=1.

    Triton's own library (tl.cdiv, the reductions) is then made of interpreted
    functions, and kernels compiled there fail with errors that are not theirs
    ("'value' object has no attribute 'data'"). `python -m engine.devtools.kernel_check`
    clears the flag before Triton is imported; tests run it as a subprocess.
    """
    from triton.language import standard
    from triton.runtime.jit import JITFunction

    if not isinstance(standard.cdiv, JITFunction):
        raise RuntimeError(
            "Triton was imported with TRITON_INTERPRET=1 in this process, so it cannot compile "
            "for a GPU here; run the check in a fresh process (python -m engine.devtools.kernel_check)"
        )


def compile_launch(launch: Launch, gpu: CheckedGPU, use_cache: bool = True) -> dict:
    """The launch compiled for `gpu`: resources, or the compile error; `cached` says which path."""
    import triton

    key = cache_key(launch, gpu)
    path = cache_dir() / f"{key}.json"
    if use_cache and path.exists():
        try:
            return dict(json.loads(path.read_text()), cached=True)
        except (OSError, ValueError):
            pass  # a torn write: compile again
    start = time.perf_counter()
    _check_compiler_mode()
    try:
        kernel = triton.compile(_source(launch), target=target(gpu),
                                options=dict(launch.options.__dict__))  # fmt: skip
        record = dict(cubin_resources(kernel.asm["cubin"]), shared=int(kernel.metadata.shared),
                      mma=tensor_core_ops(kernel.asm["ptx"]))  # fmt: skip
    except Exception as exc:  # every compile failure is a finding, not a crash
        return dict(error=summarize_error(exc), error_detail=str(exc), cached=False,
                    seconds=round(time.perf_counter() - start, 2))  # fmt: skip
    record["seconds"] = round(time.perf_counter() - start, 2)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)
    return dict(record, cached=False)
