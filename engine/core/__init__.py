"""The request lifecycle: LLMEngine steps requests through the scheduler and the model runner.

A request becomes a Sequence (sequence.py); the scheduler (scheduler.py) picks
which sequences run each step and how many tokens each; the runner (runner.py)
builds the step's tensors and runs the model that model_stack.py built with its
KV pool; LLMEngine (llm_engine.py) ties them together and turns finished steps
into RequestOutputs (outputs.py). The public faces over it are engine.llm.LLM and
engine.async_engine.AsyncEngine.
"""
