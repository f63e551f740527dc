"""The attributes an LLMEngine has always offered (`engine.pool`, `engine.kv_dtype`, ...),
read from the parts set-up built (engine/core/engine_parts.py), never copied.

Tests, benchmarks, the calibration and the agent's local client read them;
the engine itself works from `self.parts`. Read-only: to change how an engine
is built, change its EngineConfig.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.core.engine_parts import EngineParts
from engine.core.prefix_tiers import fingerprint_facts
from engine.core.scheduler import Scheduler
from engine.distributed.executor import LocalExecutor, MultiProcessExecutor
from engine.execution.runner import ModelRunner
from engine.kv.pages import PageAllocator
from engine.kv.pool import PagedKVPool
from engine.kv.prefix_spill import PrefixSpill
from engine.kv.prefix_store import PrefixStore
from engine.kv.prefix_tier_parts import FingerprintFacts
from engine.kv.radix import RadixCache
from engine.kv.sizing import KVLayout
from engine.model_files.model_config import ModelConfig
from engine.sampling.sampler import Sampler
from engine.speculative import Speculator


class EngineAttributes:
    parts: EngineParts

    # ----- how it was set up ------------------------------------------------------
    @property
    def config(self) -> EngineConfig:
        return self.parts.config

    @property
    def model_dir(self) -> Path:
        return self.parts.model_dir

    @property
    def device(self) -> torch.device:
        return self.parts.device

    @property
    def tokenizer(self) -> Any:
        return self.parts.tokenizer

    @property
    def tensor_parallel(self) -> bool:
        return self.parts.tensor_parallel

    @property
    def eos_token_ids(self) -> set[int]:
        return self.parts.eos_token_ids

    @property
    def fingerprint_facts(self) -> FingerprintFacts:
        """What decides the K/V bytes a prefill writes (the disk tier's and the cached
        start-up scales' key)."""
        return fingerprint_facts(self.config, self.parts.rank, self.model_dir, self.device)

    # ----- the model and the numerics decided for it (engine/execution/rank_model.py)
    @property
    def model(self) -> torch.nn.Module:
        return self.parts.rank.model

    @property
    def model_config(self) -> ModelConfig:
        return self.parts.rank.model_config

    @property
    def dtype(self) -> torch.dtype:
        return self.parts.rank.dtype

    @property
    def kv_dtype(self) -> str:
        return self.parts.rank.kv_dtype

    @property
    def max_model_len(self) -> int:
        return self.parts.rank.max_model_len

    @property
    def layout(self) -> KVLayout:
        return self.parts.rank.layout

    @property
    def kv_rotation(self) -> str:
        return self.parts.rank.kv_rotation

    @property
    def kv_rotation_detail(self) -> str:
        return self.parts.rank.kv_rotation_detail

    @property
    def kv_scales_file(self) -> dict | None:
        return self.parts.rank.kv_scales_file

    @property
    def cpu_kernel(self) -> str:
        return self.parts.rank.cpu_kernel

    @property
    def weight_bytes(self) -> int:
        return self.parts.weight_bytes

    @property
    def linear_methods(self) -> dict[str, int]:
        return self.parts.linear_methods

    # ----- what runs a step -------------------------------------------------------
    @property
    def pool(self) -> PagedKVPool:
        return self.parts.rank.pool

    @property
    def capacity_tokens(self) -> int:
        return self.parts.rank.pool.capacity_tokens

    @property
    def runner(self) -> ModelRunner:
        return self.parts.rank.runner

    @property
    def executor(self) -> LocalExecutor | MultiProcessExecutor:
        return self.parts.executor

    @property
    def allocator(self) -> PageAllocator:
        return self.parts.allocator

    @property
    def scheduler(self) -> Scheduler:
        return self.parts.scheduler

    @property
    def speculator(self) -> Speculator:
        return self.parts.speculator

    @property
    def sampler(self) -> Sampler:
        return self.parts.sampler

    # ----- the prefix cache and its tiers (engine/core/prefix_tiers.py) ---------------
    @property
    def prefix_cache(self) -> RadixCache | None:
        return self.parts.prefix.cache

    @property
    def prefix_store(self) -> PrefixStore | None:
        return self.parts.prefix.store

    @property
    def prefix_spill(self) -> PrefixSpill | None:
        return self.parts.prefix.spill
