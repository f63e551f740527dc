"""The model as one rank runs it: built with its KV pool and attention backend
(rank_model.py, the same on rank 0 and on every worker: the numerics decided in
weight_packing.py, layer_kernels.py and engine/kv), fed one step at a
time (runner.py).
"""
