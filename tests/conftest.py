"""Suite-wide set-up that must happen before any test module is imported.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when the
kernel modules are first imported, which any test module may do; on a
machine without a GPU the kernels can only run in the interpreter.
"""

from __future__ import annotations

import os
import tempfile

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The prefix KV disk tier (agent sessions, `resident serve`) writes under the user
# cache; tests, and the servers and CLIs they start, write to a folder of their own.
os.environ.setdefault("RESIDENT_CACHE_DIR", tempfile.mkdtemp(prefix="resident-test-cache-"))
