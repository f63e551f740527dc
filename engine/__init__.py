"""Resident's inference engine: paged FP8 KV cache, continuous batching, Llama/GLM models.

from engine import LLM, SamplingParams
"""

from engine.errors import EngineError
from engine.requests.params import SamplingParams


def __getattr__(name: str):
    # LLM pulls in torch and transformers; import it only when asked for.
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams", "EngineError"]
