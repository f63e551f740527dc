"""The CPU's matrix instructions: AMX tiles, AVX-512 VNNI and BF16, as this process may use them.

AMX needs three things: the CPU's flags (`amx_tile`, `amx_bf16`, `amx_int8`),
a kernel that saves the tile state, and this process's permission to use it
(Linux grants it on request, `arch_prctl(ARCH_REQ_XCOMP_PERM)`; torch asks
through `torch._C._cpu._init_amx`, which oneDNN's AMX kernels also need). An
Intel Xeon of the project's kind has all three; the AMD Zen machines have
AVX-512 VNNI and BF16 but no AMX.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class CPUFeatures:
    amx_tile: bool
    amx_bf16: bool
    amx_int8: bool
    amx_permitted: bool  # the kernel granted this process the tile state
    avx512_vnni: bool
    avx512_bf16: bool

    @property
    def amx(self) -> bool:
        """AMX BF16 tiles usable here: the flags and the permission."""
        return self.amx_tile and self.amx_bf16 and self.amx_permitted

    @property
    def matrix_isa(self) -> str:
        """The fastest matrix instructions this process may use, in words."""
        if self.amx:
            return "amx"
        if self.avx512_vnni:
            return "avx512_vnni"
        return "avx2" if torch.cpu._is_avx2_supported() else "baseline"


def _cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _request_amx() -> bool:
    """Ask the kernel for the AMX tile state (what oneDNN needs too); False if refused."""
    init = getattr(torch._C._cpu, "_init_amx", None)
    try:
        return bool(init()) if init is not None else False
    except RuntimeError:
        return False


def read_features(cpuinfo: str | None = None, request_amx=_request_amx) -> CPUFeatures:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = _cpu_flags(cpuinfo)
    amx_tile = "amx_tile" in flags
    return CPUFeatures(
        amx_tile=amx_tile,
        amx_bf16="amx_bf16" in flags,
        amx_int8="amx_int8" in flags,
        amx_permitted=amx_tile and request_amx(),
        avx512_vnni="avx512_vnni" in flags,
        avx512_bf16="avx512_bf16" in flags,
    )


@functools.cache
def cpu_features() -> CPUFeatures:
    """This machine's features, read once (asking for the AMX permission on the way)."""
    return read_features()


def describe_cpu() -> dict:
    """For logs, `/v1/engine/stats` and benchmark records."""
    features = cpu_features()
    return {"cpu_matrix_isa": features.matrix_isa, "cpu_features": asdict(features)}
