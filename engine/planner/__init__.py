"""The memory planner: KV bytes per token and KV capacity for a model on a GPU set.

capacity.py plans, presets.py knows published model shapes by name, and
weight_bytes.py counts the weight bytes each GPU holds. Nothing here loads weights.
"""
