"""What `resident bench` measures, each printing JSON: throughput.py (the library),
serving.py and serving_paths.py (the HTTP server, the async engine and peers),
accuracy.py (FP8 KV against BF16), kv_budget.py (tokens per GiB)."""
