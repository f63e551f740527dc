"""The attention backends' names and what each is, declared once and torch-free.

EngineConfig.attention_backend takes exactly these names and `resident serve
--help` shows them without loading torch; engine/attention/registry.py binds
each name to the code that builds the backend (torch and the kernels).
"""

from __future__ import annotations

BACKEND_HELP: dict[str, str] = {
    "auto": "triton on CUDA; else cpu where its C kernels run, else torch",
    "torch": "the reference, in torch ops (any device)",
    "cpu": "C kernels for paged decode and prefill (CPU only)",
    "triton": "Triton kernels (CUDA GPU)",
}
BACKEND_NAMES: tuple[str, ...] = tuple(BACKEND_HELP)
