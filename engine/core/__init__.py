"""The request lifecycle: LLMEngine (llm_engine.py) steps requests through the scheduler.

A request (engine/requests: what it asks, its Sequence, what it returns) waits
in the scheduler (scheduler.py), which picks each step's sequences and how many
tokens each, from the pages the KV cache has; the step runs on the model
(engine/execution), through the ranks' executor when tensor-parallel
(engine/distributed); the sampler (engine/sampling) picks the next tokens and
LLMEngine turns finished steps into RequestOutputs. The public faces over it
are engine.llm.LLM and engine.async_engine.AsyncEngine.
"""
