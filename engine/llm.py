"""LLM: the synchronous, offline entry point (`from engine import LLM, SamplingParams`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from engine.chat import ParsedChatMessage
from engine.config import EngineConfig, engine_settings
from engine.core.llm_engine import LLMEngine
from engine.errors import EngineError, KVCapacityError
from engine.host.memory_advice import start_up_finished
from engine.kv.quant import CALIBRATION_MARGIN
from engine.kv.scales import scales_document, write_scales_file
from engine.rendering import ChatRenderer, RenderedChat
from engine.requests.outputs import RequestOutput
from engine.requests.params import SamplingParams

GIB = 1024**3


@dataclass
class ChatOutput(RequestOutput):
    """A RequestOutput plus the reply read as the server reads it (reasoning, content,
    tool calls), by the parser the renderer chose for the prompt."""

    message: ParsedChatMessage | None = None


class LLM:
    """Loads a model once and generates for lists of prompts.

    `model` is a model name from `resident models list`, a Hugging Face model
    folder, or a `.gguf` file. The keyword arguments are EngineConfig's settings
    (engine/config.py declares each: its type, default and allowed values), e.g.
    `kv_cache_dtype`; `tensor_parallel_size=N` runs the model on N processes
    (engine.distributed; `close()` or a `with` block stops them). What is not
    given (None) takes EngineConfig's default (engine.config.engine_settings), as
    `resident serve` does: the fastest attention backend and CPU kernels this
    machine runs, so a script and the server measure the same engine.
    `attention_backend="torch"` asks for the reference implementation.
    """

    def __init__(
        self,
        model: str,
        dtype: str | None = None,
        kv_cache_dtype: str | None = None,
        attention_backend: str | None = None,
        kv_memory: float | None = None,
        **kwargs,
    ):
        kv_memory_gib = kwargs.pop("kv_memory_gib", kv_memory)
        self.config = EngineConfig(
            **engine_settings(
                model=str(model),
                dtype=dtype,
                kv_cache_dtype=kv_cache_dtype,
                attention_backend=attention_backend,
                kv_memory_gib=kv_memory_gib,
                **kwargs,
            )
        )
        self.engine = LLMEngine(self.config)
        start_up_finished()  # the engine is built: background work may begin

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """An LLM over an engine already built (e.g. to calibrate it before serving)."""
        llm = cls.__new__(cls)
        llm.config, llm.engine = engine.config, engine
        return llm

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def close(self) -> None:
        """Stop the tensor-parallel worker processes, if any (also done at exit)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

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

    def _run(
        self, request_ids: list[str], after_step: Callable[[], None] | None = None
    ) -> list[RequestOutput]:
        final: dict[str, RequestOutput] = {}
        while len(final) < len(request_ids):
            outputs = self.engine.step()
            if after_step is not None:
                after_step()
            for output in outputs:
                if output.error:
                    for request_id in request_ids:
                        self.engine.abort(request_id)
                    raise KVCapacityError(output.error)
                if output.finished:
                    final[output.request_id] = output
            if not self.engine.has_unfinished() and len(final) < len(request_ids):
                raise RuntimeError("engine stopped with requests unfinished")
        return [final[r] for r in request_ids]

    @cached_property
    def chat_renderer(self) -> ChatRenderer:
        """The model's chat renderer: the one the server and the agent's local client use."""
        return ChatRenderer.for_model_dir(self.tokenizer, self.engine.model_dir)

    def render_chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> RenderedChat:
        """The prompt `chat` would send (text, token ids) and how its answer is read.
        Keyword arguments reach the template (e.g. `enable_thinking=False`)."""
        return self.chat_renderer.render(
            messages,
            tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            template_kwargs=template_kwargs,
        )

    def chat(
        self,
        messages: list[dict],
        sampling_params: SamplingParams | None = None,
        tools: list[dict] | None = None,
        *,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> ChatOutput:
        """Render one conversation as the server would, generate a reply, and read it.

        The prompt and the parser are the server's for the same messages and
        tools (`render_chat`); `.message` holds the reply's content, reasoning
        and tool calls. Special tokens are kept in the text exactly when the
        parser needs them (Kimi's call markers), whatever `sampling_params` says.
        """
        prompt = self.render_chat(
            messages, tools, continue_final_message=continue_final_message, **template_kwargs
        )
        params = replace(
            sampling_params or SamplingParams(), skip_special_tokens=prompt.skip_special_tokens
        )
        output = self.generate([prompt.token_ids], params)[0]
        return _chat_output(output, prompt.parse(output.outputs[0].text))

    def prompt_logits(
        self,
        token_ids: list[int],
        chunk_size: int | None = None,
        reduce: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
        decode_last: int = 0,
    ) -> torch.Tensor:
        """Logits at every prompt position [len, vocab], computed through the paged cache.

        `chunk_size` splits the prefill into steps of that many tokens (1 = token
        by token, like decoding), to show the result does not depend on it.
        `reduce(logits, start)`, given the logits of one step's chunk and the
        prompt position of its first row, replaces them with what it returns
        (e.g. per-position scores), so long prompts need not keep [n, vocab].
        `decode_last` runs the last that many prompt tokens as decode steps,
        one token per step over the cached rest, after the rest is prefilled
        (in chunks of `chunk_size` or the engine's batch budget).
        """
        token_ids = list(token_ids)
        split = len(token_ids) - decode_last
        if decode_last and not 0 < split < len(token_ids):
            raise ValueError("decode_last must leave at least one token to prefill")

        def cap(computed: int) -> int | None:
            if not decode_last:
                return chunk_size
            remaining = split - computed
            step = remaining if remaining > 0 else 1  # no prefill chunk crosses the split
            return step if chunk_size is None else min(chunk_size, step)

        params = SamplingParams(max_tokens=1, temperature=0)
        seq = self.engine.add_request(token_ids, params, max_chunk=cap(0), collect_logits=True)
        reduced: list[torch.Tensor] = []
        position = [None]

        def after_step() -> None:
            seq.max_chunk = cap(seq.num_computed_tokens)
            if reduce is None:
                return
            if position[0] is None:
                position[0] = seq.num_cached_tokens
            for logits in seq.collected_logits:
                reduced.append(reduce(logits, position[0]))
                position[0] += logits.shape[0]
            seq.collected_logits.clear()

        self._run([seq.request_id], after_step)
        return torch.cat(reduced if reduce is not None else seq.collected_logits)

    def calibrate_kv_scales(
        self,
        prompts: SequenceABC[str | list[int]],
        path: str | Path | None = None,
        margin: float | None = None,
        source: str = "calibrated",
    ) -> dict:
        """Calibrate the FP8 KV scales over a prompt set, freeze them, and return them.

        Every prompt is prefilled (the prefix cache is emptied first, so none is
        skipped) while the pool records the |max| of each layer's K and V (per
        KV head with `kv_scales_per_head`); the scales become amax / 448 with
        the calibration margin (engine.kv.quant.CALIBRATION_MARGIN unless
        given). Cached pages written with the old scales are dropped, pinned ones
        included (their pins stay; they are prefilled again). With
        `path`, the scales are also written as the JSON file `kv_scales_file`
        (`resident serve --kv-scales`) reads.
        """
        engine = self.engine
        pool = engine.pool
        if engine.tensor_parallel:
            raise EngineError(
                "calibrate_kv_scales runs in one process: with tensor_parallel_size > 1 each "
                "rank holds only its shard of the pool. Calibrate with tensor_parallel_size=1 "
                "and pass the scales file (kv_scales_file, `resident serve --kv-scales`), or "
                "let the first prefill set the scales (the maximum over the ranks)"
            )
        if not pool.is_fp8:
            raise EngineError("KV scales are calibrated for kv_cache_dtype fp8_e4m3 only")
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise EngineError("give at least one prompt to calibrate on")
        if engine.prefix_cache is not None:
            engine.prefix_cache.clear(pinned=True)
        pool.observe(True)
        try:
            for prompt in prompts:  # one at a time: a long set need not fit the cache at once
                self.generate([prompt], SamplingParams(max_tokens=1, temperature=0))
            scales = pool.observed_scales(margin)
        finally:
            pool.observe(False)
        pool.set_scales(*scales, source=source)
        if engine.prefix_cache is not None:  # pinned pages too: written with the old scales
            engine.prefix_cache.clear(pinned=True)
        used_margin = CALIBRATION_MARGIN if margin is None else margin
        document = scales_document(pool, engine.kv_rotation, self.config.model, used_margin)
        document["prompts"] = len(prompts)
        if path is not None:
            write_scales_file(path, document)
        return document

    def save_kv_scales(self, path: str | Path) -> dict:
        """Write the scales in force as a scales file (`--kv-scales`); returns the document."""
        engine = self.engine
        document = scales_document(engine.pool, engine.kv_rotation, self.config.model)
        write_scales_file(path, document)
        return document

    def stats(self) -> dict:
        pool = self.engine.pool
        return {
            "kv_cache_dtype": pool.kv_dtype,
            "capacity_tokens": pool.capacity_tokens,
            "kv_bytes": pool.nbytes,
            "scale_source": pool.scale_source,
            "kv_rotation": self.engine.kv_rotation,
            "max_context_tokens": self.engine.max_model_len,
            "weight_bytes": self.engine.weight_bytes,
            "linear_methods": self.engine.linear_methods,
        }


def _chat_output(output: RequestOutput, message: ParsedChatMessage) -> ChatOutput:
    values: Mapping[str, Any] = {f.name: getattr(output, f.name) for f in fields(output)}
    return ChatOutput(**values, message=message)
