"""The request lifecycle: LLMEngine (llm_engine.py) steps requests through the scheduler.

A request (engine/requests: what it asks, its Sequence, what it returns) comes
in through intake.py (encoded, checked, made a Sequence) and waits in the
scheduler (scheduler.py), which picks each step's sequences and how many
tokens each, from the pages the KV cache has; the step runs on the model
(engine/execution), through the ranks' executor when tensor-parallel
(engine/distributed); the sampler (engine/sampling) picks the next tokens,
draft_acceptance.py keeps what a speculative draft got right, and
output_processor.py turns tokens into text, stops and RequestOutputs.
engine_parts.py sets the parts up (prefix_tiers.py the prefix cache and its
tiers, worker_ranks.py the other tensor-parallel ranks), engine_stats.py reports on them, and engine_attributes.py keeps the
attributes an engine has always offered. The public faces over it are
engine.llm.LLM and engine.async_engine.AsyncEngine.
"""
