"""Triton attention kernels (the GPU backend): FP8/BF16 paged KV write, decode, prefill, MLA decode.

Importing this package does not import Triton; `triton_available()` says
whether it can be, and `interpreting()` whether kernels run in Triton's CPU
interpreter (TRITON_INTERPRET=1, how the tests run them without a GPU).
The kernels themselves live in one module each:

- kv_write:   quantize (saturating) and store new K/V or MLA rows at their slots
- decode:     one query per sequence, GQA, split along the context + merge
- prefill:    a chunk of queries over its cached, paged prefix and itself, causal
- mla_decode: absorbed MLA queries over latent rows, split + the same merge
- backend:    TritonAttentionBackend, the interface the torch backend implements
"""

from __future__ import annotations

import os

_TRUE = ("1", "true", "on", "yes")


def triton_available() -> bool:
    """Whether `import triton` works (it is a Linux x86-64 dependency only)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether Triton kernels run in the CPU interpreter (read when a kernel module is imported)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


__all__ = ["interpreting", "triton_available"]
