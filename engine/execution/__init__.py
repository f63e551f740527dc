"""The model as one rank runs it: built with its KV pool and attention backend
(model_stack.py, the same on rank 0 and on every worker), fed one step at a
time (runner.py).
"""
