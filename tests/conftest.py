"""Suite-wide set-up that must happen before any test module is imported.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when the
kernel modules are first imported, which any test module may do; on a
machine without a GPU the kernels can only run in the interpreter.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
