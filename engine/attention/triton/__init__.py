"""Triton attention kernels (the GPU backend): FP8/BF16 paged KV write, decode, prefill, MLA decode.

Importing this package does not import Triton; `triton_available()` says
whether it can be, and `interpreting()` whether kernels run in Triton's CPU
interpreter (TRITON_INTERPRET=1, how the tests run them without a GPU).
The kernels themselves live in one module each:

- kv_write:   quantize (saturating) and store new K/V or MLA rows at their slots
- decode:     one query per sequence, GQA, split along the context + merge
- prefill:    a chunk of queries over its cached, paged prefix and itself, causal
- mla_decode: absorbed MLA queries over latent rows, split + the same merge
- index_scores: the DSA indexer's decode scores over its paged keys (sparse MLA decode
                is mla_decode over the selected slots)
- backend:    TritonAttentionBackend, the interface the torch backend implements
- target:     the GPU a launch is sized for (its own, or the compile check's)
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

_TRUE = ("1", "true", "on", "yes")
# The Triton releases every kernel here (and in engine/gpu_kernels) was compiled
# with for sm_90 by `python -m engine.devtools.kernel_check` without a problem: 3.5, 3.6,
# 3.8 and 3.9. Triton 3.4 and older were never checked (the check itself needs
# 3.5's launch binder), so the engine refuses them at start rather than meet a
# compile error in the middle of a request.
OLDEST_TRITON = (3, 5)
NEWEST_CHECKED_TRITON = (3, 9)


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


def triton_version() -> tuple[int, int] | None:
    """The installed Triton's (major, minor), read from its package metadata (no import)."""
    try:
        text = version("triton")
    except PackageNotFoundError:
        return None
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def triton_version_problem() -> str | None:
    """Why the installed Triton cannot run the engine's kernels, or None when it can."""
    found = triton_version()
    if found is None or found >= OLDEST_TRITON:
        return None
    oldest = ".".join(map(str, OLDEST_TRITON))
    return (
        f"Triton {found[0]}.{found[1]} is installed; the GPU kernels need Triton {oldest} or "
        f"newer (pip install 'triton>={oldest}', or a torch build that brings one: "
        "torch 2.11's CUDA build pins Triton 3.6)"
    )


def triton_untested(found: tuple[int, int] | None = None) -> bool:
    """Whether the installed Triton is newer than any the compile check has run with."""
    found = triton_version() if found is None else found
    return found is not None and found > NEWEST_CHECKED_TRITON


__all__ = ["interpreting", "triton_available", "triton_version", "triton_version_problem"]
