"""The GPUs the kernels are compiled for, and what one thread block may use on them.

H200 (Hopper, sm_90) is the GPU the engine is built for and is always
checked. B200 (Blackwell, sm_100) is checked when the installed Triton
carries a ptxas that knows it (`ptxas-blackwell`: Triton 3.6's wheel and
later have it, 3.5's has not). Both allow one block 227 KiB of shared memory when it opts in
(cudaDevAttrMaxSharedMemoryPerBlockOptin = 232,448 bytes; the SM's other
1 KiB is reserved by the driver), the figure Triton itself compares a
kernel's shared memory with before launching it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.attention.triton.target import PlannedGPU

SHARED_OPTIN_BYTES = 227 * 1024


@dataclass(frozen=True)
class CheckedGPU:
    planned: PlannedGPU  # what the launchers size their launches for
    arch: int  # Triton's GPUTarget arch: 90 for sm_90
    shared_limit: int  # bytes of shared memory one block may use

    @property
    def name(self) -> str:
        return self.planned.name

    @property
    def sm(self) -> str:
        return f"sm_{self.arch}"


H200 = CheckedGPU(PlannedGPU("H200", (9, 0), 132), 90, SHARED_OPTIN_BYTES)
B200 = CheckedGPU(PlannedGPU("B200", (10, 0), 148), 100, SHARED_OPTIN_BYTES)


def _has_tool(name: str) -> bool:
    """Whether Triton finds its bundled (or TRITON_<NAME>_PATH) NVIDIA tool `name`."""
    from triton import knobs

    try:
        getattr(knobs.nvidia, name).path  # noqa: B018 - resolving the path is the check
    except (RuntimeError, AttributeError):
        return False
    return True


def checked_gpus() -> list[CheckedGPU]:
    """H200, and B200 when this Triton can assemble for sm_100."""
    return [H200, B200] if _has_tool("ptxas_blackwell") else [H200]


def target(gpu: CheckedGPU):
    """Triton's GPUTarget for `gpu` (32 threads per warp)."""
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", gpu.arch, 32)


def cuobjdump_path() -> str | None:
    """The cuobjdump inside Triton's wheel, which reads a cubin's resource usage."""
    from triton import knobs

    try:
        return knobs.nvidia.cuobjdump.path
    except (RuntimeError, AttributeError):
        return None
