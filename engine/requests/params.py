"""SamplingParams: what a request asks of generation, validated up front."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import EngineError
from engine.grammar.spec import StructuredOutput

# What torch.Generator().manual_seed takes; outside it, it raises deep in the engine.
SEED_RANGE = (-(2**63), 2**64 - 1)
# Token ids meet 32-bit tensors and the grammar engine.
MAX_TOKEN_ID = 2**31 - 1


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k cut
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top-n logprobs per sampled token (0: the sampled one only)
    prompt_logprobs: int | None = None  # the same for prompt tokens
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    # Constrained decoding: the output follows this JSON schema, regex or tool-call
    # format (engine.grammar); it ends when the grammar does.
    structured: StructuredOutput | None = None
    # Speculative decoding (engine.speculative) for this request: None follows the
    # engine's default; requests with presence, frequency or repetition penalties
    # do not speculate.
    speculative: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        # NaN fails every comparison below; infinity is refused where a bound would let it by.
        checks = [
            (self.max_tokens >= 1, "max_tokens must be at least 1"),
            (
                self.temperature >= 0 and math.isfinite(self.temperature),
                "temperature must be a finite number >= 0",
            ),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k >= -1, "top_k must be -1, 0 (off) or positive"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs must be 0..20"),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
                "prompt_logprobs must be 0..20",
            ),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (
                self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty),
                "repetition_penalty must be a finite number > 0",
            ),
            (
                self.seed is None or SEED_RANGE[0] <= self.seed <= SEED_RANGE[1],
                "seed must be a 64-bit integer (from -2**63 to 2**64 - 1)",
            ),
            (
                all(0 <= token <= MAX_TOKEN_ID for token in self.stop_token_ids),
                f"stop_token_ids must be token ids, 0 to {MAX_TOKEN_ID}",
            ),
            (
                self.structured is None or isinstance(self.structured, StructuredOutput),
                "structured must be an engine.grammar.StructuredOutput",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise EngineError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
