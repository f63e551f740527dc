"""LLM: the synchronous, offline entry point (`from engine import LLM, SamplingParams`)."""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC

import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import KVCapacityError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

GIB = 1024**3


class LLM:
    """Loads a model once and generates for lists of prompts.

    `model` is a model name from `resident models list`, a Hugging Face model
    folder, or a `.gguf` file. `dtype` is auto, bfloat16 or float32;
    `kv_cache_dtype` auto (the model's dtype), bf16 or fp8_e4m3.
    """

    def __init__(
        self,
        model: str,
        dtype: str = "auto",
        kv_cache_dtype: str = "fp8_e4m3",
        attention_backend: str = "torch",
        kv_memory: float | None = None,
        **kwargs,
    ):
        kv_memory_gib = kwargs.pop("kv_memory_gib", kv_memory)
        self.config = EngineConfig(
            model=str(model),
            dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            attention_backend=attention_backend,
            kv_memory_gib=kv_memory_gib,
            **kwargs,
        )
        self.engine = LLMEngine(self.config)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | list[int] | SequenceABC[str | list[int]],
        sampling_params: SamplingParams | SequenceABC[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """One output per prompt, in order; all prompts run together, batched."""
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError("give one SamplingParams or one per prompt")
        seqs = []
        try:
            for prompt, params in zip(prompts, params_list, strict=True):
                seqs.append(self.engine.add_request(prompt, params))
        except Exception:
            for seq in seqs:
                self.engine.abort(seq.request_id)
            raise
        return self._run([s.request_id for s in seqs])

    def _run(self, request_ids: list[str]) -> list[RequestOutput]:
        final: dict[str, RequestOutput] = {}
        while len(final) < len(request_ids):
            for output in self.engine.step():
                if output.error:
                    for request_id in request_ids:
                        self.engine.abort(request_id)
                    raise KVCapacityError(output.error)
                if output.finished:
                    final[output.request_id] = output
            if not self.engine.has_unfinished() and len(final) < len(request_ids):
                raise RuntimeError("engine stopped with requests unfinished")
        return [final[r] for r in request_ids]

    def chat(
        self,
        messages: list[dict],
        sampling_params: SamplingParams | None = None,
        tools: list[dict] | None = None,
        **template_kwargs,
    ) -> RequestOutput:
        """Render one conversation with the model's chat template and generate a reply."""
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False, **template_kwargs
        )
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self.generate([ids], sampling_params)[0]

    def prompt_logits(self, token_ids: list[int], chunk_size: int | None = None) -> torch.Tensor:
        """Logits at every prompt position [len, vocab], computed through the paged cache.

        `chunk_size` splits the prefill into steps of that many tokens (1 = token
        by token, like decoding), to show the result does not depend on it.
        """
        params = SamplingParams(max_tokens=1, temperature=0)
        seq = self.engine.add_request(
            list(token_ids), params, max_chunk=chunk_size, collect_logits=True
        )
        self._run([seq.request_id])
        return torch.cat(seq.collected_logits)

    def stats(self) -> dict:
        pool = self.engine.pool
        return {
            "kv_cache_dtype": pool.kv_dtype,
            "capacity_tokens": pool.capacity_tokens,
            "kv_bytes": pool.nbytes,
            "scale_source": pool.scale_source,
            "max_context_tokens": self.engine.max_model_len,
        }
