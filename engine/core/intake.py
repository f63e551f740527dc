"""A request's way in: the prompt encoded and checked, its Sequence built, its id kept.

What is refused here never reaches the scheduler: token ids outside the
vocabulary, an empty prompt, a prompt that leaves no room in the context for
one generated token, a request id already in use. The live requests are kept
by id until their last output (or an abort), so an id is never reused while
its request runs.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from engine.errors import EngineError, PromptTooLongError
from engine.model_files.model_config import ModelConfig
from engine.requests.outputs import RequestOutput
from engine.requests.params import SamplingParams
from engine.requests.sequence import Sequence
from engine.tokenizers.detokenizer import IncrementalDetokenizer


class RequestIntake:
    def __init__(
        self,
        tokenizer: Any,
        model_config: ModelConfig,
        max_model_len: int,
        eos_token_ids: set[int],
    ):
        # tokenizer, model_config and eos_token_ids are also what a request's grammar
        # is built from (engine.grammar.backend.GrammarVocabulary).
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.requests: dict[str, Sequence] = {}
        self._ids = itertools.count()

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        ids = [int(t) for t in prompt]
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise EngineError(f"token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})")
        return ids

    def sequence(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None,
        max_chunk: int | None,
        collect_logits: bool,
        cache_salt: str,
    ) -> Sequence:
        """The request as the scheduler takes it; not yet kept (`keep`, once admitted)."""
        ids = self.encode(prompt)
        if not ids:
            raise EngineError("the prompt is empty; give at least one token")
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens but the context holds {self.max_model_len} "
                "(prompt plus at least one generated token); shorten the prompt"
            )
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise EngineError(f"request id {request_id!r} is already in use")
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=ids,
            params=params,
            prompt_text=prompt if isinstance(prompt, str) else None,
            max_chunk=max_chunk,
            collect_logits=collect_logits,
            cache_salt=cache_salt,
            detok=IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens),
        )
        if params.seed is not None:
            seq.generator = torch.Generator().manual_seed(params.seed)
        if params.structured is not None:
            from engine.grammar.backend import request_grammar  # xgrammar only when used

            seq.grammar = request_grammar(self, params)
        return seq

    def keep(self, seq: Sequence) -> None:
        """Track an admitted request until its last output."""
        self.requests[seq.request_id] = seq

    def release(self, request_id: str) -> Sequence | None:
        """Stop tracking a request (aborted); returns it if it was still tracked."""
        return self.requests.pop(request_id, None)

    def release_finished(self, outputs: list[RequestOutput]) -> None:
        """Forget the requests these outputs finish: their ids may be used again."""
        for output in outputs:
            if output.finished:
                self.requests.pop(output.request_id, None)
