"""The KV cache: page allocation (pages.py), storage pools (pool_base.py, pool.py,
mla_pool.py, chosen by pools.py), FP8 quantization and scales (quant.py, scales.py,
calibration.py), the Hadamard rotation (rotation.py), sizing and dtypes (sizing.py,
dtypes.py, which also resolves "auto"), the pool's budget (pool_budget.py), the
prefix cache (radix.py) and its tiers (prefix_spill.py to host memory,
host_tier.py; prefix_store.py to disk, disk_tier.py and its folder, disk_files.py),
which see only what prefix_tier_parts.py hands them, and the KV events they
report for cache-aware routers (kv_events.py: vLLM's messages and block hashes;
kv_event_recorder.py; kv_event_publisher.py over ZMQ).

Importing the package imports nothing: its dtype table is read by the CLI
without loading torch.
"""
