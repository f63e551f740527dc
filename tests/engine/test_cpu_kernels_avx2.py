"""The AVX2 build of the CPU kernels (avx512_on_avx2.h) is held to the same torch
references as the AVX-512 one, wherever the suite runs: on an AVX2-only CPU the kernel
tests use it anyway; on an AVX-512 CPU they run again here, in a process that asks for
the AVX2 build (RESIDENT_CPU_ISA=avx2)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cpu_kernels import library

HERE = Path(__file__).parent
# The files that reach every kernel and every emulated operation: grid products in each
# format, K-quant repacking, MoE experts, MLA decode on latent grids, paged attention,
# FP8 KV writes, prefill attention (BF16 pair products), norms, rotary and the Hadamard
# transform.
KERNEL_TESTS = (
    "test_cpu_kernels.py",
    "test_cpu_layer_ops.py",
    "test_gguf_kquants.py",
    "test_cpu_moe_experts.py",
    "test_mla_decode_kernel.py",
    "test_mla_decode_grid.py",
    "test_cpu_prefill.py",
    "test_cpu_kernels_avx2.py",  # the check below, inside that process
)


def test_an_unknown_isa_is_named_in_the_reason(monkeypatch):
    monkeypatch.setenv(library.ISA_ENV, "sse2")
    isa, reason = library._isa()
    assert isa is None
    assert "RESIDENT_CPU_ISA=sse2" in reason and "avx2" in reason


def test_the_kernels_build_wherever_they_can():
    """A C change that no longer compiles must fail the suite: every kernel test skips
    where the library is unavailable, so without this the suite would pass on torch."""
    if os.environ.get("RESIDENT_CPU_KERNELS", "1") == "0":
        pytest.skip("kernels switched off by RESIDENT_CPU_KERNELS=0")
    isa, _ = library._isa()
    if isa is None or library._compiler() is None or platform.machine() != "x86_64":
        pytest.skip("no build of the kernels fits this machine")
    assert library.unavailable() == ""


@pytest.mark.skipif(not os.environ.get(library.ISA_ENV), reason="no build asked for")
def test_the_build_asked_for_is_the_one_loaded():
    assert library.unavailable() == ""
    assert library.isa() == os.environ[library.ISA_ENV]


def _runs_both() -> bool:
    return library.isa() == "avx512" and all(
        library.has_cpu_flag(flag) for flag in ("avx2", "fma", "f16c")
    )


@pytest.mark.skipif(not _runs_both(), reason="the AVX2 build is the suite's own here, or none")
def test_the_avx2_build_passes_the_kernel_tests():
    env = {**os.environ, library.ISA_ENV: "avx2", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0"]
    done = subprocess.run(
        [*command, *(str(HERE / name) for name in KERNEL_TESTS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    # A failure there names the test; the build check inside fails if another build loaded.
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
