"""The building blocks models are made of, and how each computes.

linear.py (tensor-parallel linear layers) computes through a method chosen at
load (linear_methods.py dense, batch_invariant.py tiled, cpu_grid_weights.py
4-/8-bit grids for the CPU kernels, packed_methods.py checkpoint FP8/INT4,
gpu_linear.py their GPU kernels; packed_plan.py decides which layers stay
packed); layer_ops.py the norms, SwiGLU, rotary and rotations in torch or C,
gpu_layer_ops.py in Triton on a GPU;
moe.py, moe_routing.py and fused_experts.py the mixture of experts;
rotary.py, yarn.py, norm.py, activation.py, vocab_parallel.py the rest.
"""
