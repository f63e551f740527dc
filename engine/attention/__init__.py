"""Attention over the paged KV cache, one backend per kind of device.

registry.py finds a backend by name (names.py lists them, without torch):
torch_backend.py (the reference, any device), cpu_backend.py (C kernels for
paged decode and prefill), deterministic.py (batch-invariant reductions),
triton/ (the GPU kernels); metadata.py is what every backend reads of a step,
mla.py the absorbed multi-head latent attention of Kimi K2 / DeepSeek V3.
"""
