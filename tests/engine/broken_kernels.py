"""Kernels the compile check must fail, checked by `python -m tests.engine.broken_kernels`.

A process that imported Triton under TRITON_INTERPRET=1 (the test suite on
a CPU) cannot compile for a GPU, so test_gpu_compile.py runs this module in
a process of its own, as the check itself runs. It prints the table rows of
the two kernels, compiled for H200 through the check's own functions:

- one reads a plain module global (the interpreter reads it; Triton's
  compiler refuses it, as it refused layout.INT4 inside W4A16 on an H200);
- one stages tiles in shared memory that no H200 block can hold.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)  # before Triton is imported

import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from engine.devtools.kernel_check.compiler import compile_launch  # noqa: E402
from engine.devtools.kernel_check.gpus import H200  # noqa: E402
from engine.devtools.kernel_check.plan import record_launches  # noqa: E402
from engine.devtools.kernel_check.verdict import make_row  # noqa: E402

SCALE = 3  # a plain module global


def reads_a_plain_global(x_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) * SCALE)


def too_large_tiles(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    m, n, k = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + m[:, None] * K + (k0 + k)[None, :])
        b = tl.load(b_ptr + (k0 + k)[:, None] * BN + n[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + m[:, None] * BN + n[None, :], acc)


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.bfloat16, device="meta")


def _row(launcher) -> dict:
    """The one launch `launcher()` makes, planned and compiled for H200 (no cache), as a row."""
    (launch,) = record_launches(H200, lambda recorder: launcher())
    row = make_row(launch, H200, compile_launch(launch, H200, use_cache=False))
    row.pop("error_detail", None)
    return row


def rows() -> dict[str, dict]:
    global_reader = JITFunction(reads_a_plain_global)
    large = JITFunction(too_large_tiles)
    a, b, c = _meta(256, 1024), _meta(1024, 256), _meta(256, 256)
    tiles = dict(BM=256, BN=256, BK=128, num_warps=8, num_stages=4)  # far beyond 227 KiB
    return {
        "module_global": _row(lambda: global_reader[(1,)](_meta(128), BLOCK=128)),
        "large_tiles": _row(lambda: large[(1,)](a, b, c, 1024, **tiles)),
    }


if __name__ == "__main__":
    json.dump(rows(), sys.stdout)
