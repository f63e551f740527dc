"""EngineConfig: every engine setting in one validated place."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DTypeName = Literal["auto", "bfloat16", "float32"]
KVDTypeName = Literal["auto", "bf16", "fp8_e4m3"]
# auto: hadamard for an fp8_e4m3 cache unless fixed scales were measured without
# rotation, else none (engine/kv/scales.py).
KVRotationName = Literal["auto", "none", "hadamard"]
# CPU products with 4-/8-bit grid weights (engine/layers/cpu_grid_weights.py):
# int8 activations (AVX-512 VNNI kernel), BF16 activations (torch's int4 kernel),
# auto: int8 where the kernel builds and runs, else bf16.
CPUKernelName = Literal["auto", "int8", "bf16"]
# none: requests speculate only when they ask; prompt_lookup: they do unless they opt out.
SpeculativeName = Literal["none", "prompt_lookup"]
# Default KV budget on CPU when none is given; GPUs size from free memory.
DEFAULT_CPU_KV_GIB = 1.0


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    dtype: DTypeName = "auto"
    kv_cache_dtype: KVDTypeName = "fp8_e4m3"
    # torch (reference, CPU), triton (GPU kernels), auto: triton on CUDA, else torch.
    # Checked by engine.attention.registry.get_backend, which says what exists.
    attention_backend: str = "auto"
    kv_memory_gib: float | None = Field(default=None, gt=0)
    page_size: int = Field(default=16, ge=1, le=1024)
    max_num_seqs: int = Field(default=64, ge=1)
    max_num_batched_tokens: int = Field(default=2048, ge=16)
    max_model_len: int | None = Field(default=None, ge=2)
    kv_scales_file: str | None = None
    # Hadamard rotation of K and V before the cache (DESIGN.md §3).
    kv_rotation: KVRotationName = "auto"
    # One FP8 scale per KV head instead of one per layer (GQA; calibration).
    kv_scales_per_head: bool = False
    enable_prefix_caching: bool = True
    verify_prefix_cache: bool = False  # hash shared pages and check them on reuse
    max_waiting: int | None = Field(default=None, ge=1)  # beyond it: overloaded
    # The disk tier of the prefix cache (engine/kv/prefix_store.py): off for the
    # library, on for the agent's local engine and `resident serve`.
    kv_disk: bool = False
    kv_disk_gib: float = Field(default=8.0, gt=0)
    kv_disk_dir: str | None = None  # default: RESIDENT_CACHE_DIR/kv or the user cache
    # The host-memory tier that pinned prefix pages spill to when they give way under
    # pool pressure (engine/kv/prefix_spill.py), in GiB; 0 turns it off. None: on for a
    # pool on a GPU (min(8 GiB, a quarter of the host's RAM)), off for a CPU pool,
    # whose pages are host memory already (they spill to the disk tier, if on).
    kv_host_gib: float | None = Field(default=None, ge=0)
    seed: int = 0
    # Batch-, chunk- and cache-invariant reductions: bit-identical outputs however
    # requests are batched, at a cost in speed (DESIGN.md §3).
    deterministic: bool = False
    cpu_kernel: CPUKernelName = "auto"
    # Speculative decoding (engine/speculative): the drafter and whether requests use it
    # by default (SamplingParams.speculative overrides per request), and the most tokens
    # one draft may hold (drafts grow and shrink below it with the acceptance rate).
    speculative: SpeculativeName = "none"
    speculative_max_draft: int = Field(default=8, ge=1, le=64)
    device: str | None = None
    # FP8 block-scaled and INT4 checkpoints: keep each quantized layer in the
    # checkpoint's form (engine/layers/packed_methods.py), or dequantize at load.
    quantized_weights: Literal["packed", "dequantized"] = "packed"
    # Tensor parallelism (engine/distributed, docs/DISTRIBUTED.md): this many ranks in
    # all, one process each; rank 0 is this process (scheduler, cache, server) and
    # starts the workers of its node. Across nodes each node runs tensor_parallel_size
    # / nnodes ranks and meets the others at master_addr:master_port (TCP rendezvous).
    tensor_parallel_size: int = Field(default=1, ge=1)
    expert_parallel: bool = False  # MoE: routed experts dealt whole to ranks
    nnodes: int = Field(default=1, ge=1)
    node_rank: int = Field(default=0, ge=0)
    master_addr: str = "127.0.0.1"
    # None: a free loopback port (one node); required with nnodes > 1.
    master_port: int | None = Field(default=None, ge=1, le=65535)

    @model_validator(mode="after")
    def _check_parallel(self) -> EngineConfig:
        tp, nnodes = self.tensor_parallel_size, self.nnodes
        if tp % nnodes:
            raise ValueError(
                f"tensor_parallel_size {tp} does not split evenly over {nnodes} nodes; "
                "give each node the same number of ranks"
            )
        if self.node_rank >= nnodes:
            raise ValueError(f"node_rank {self.node_rank} must be below nnodes {nnodes}")
        if nnodes > 1 and self.master_port is None:
            raise ValueError(
                "master_port is required with nnodes > 1: every node must meet rank 0 "
                "at the same master_addr:master_port"
            )
        return self

    @property
    def local_ranks(self) -> int:
        """Ranks (processes) on each node."""
        return self.tensor_parallel_size // self.nnodes


# The settings that decide speed and numerics; `resident serve` (ServeOptions)
# and `LLM(...)` both start from EngineConfig's defaults for them.
PERFORMANCE_SETTINGS = ("dtype", "kv_cache_dtype", "kv_rotation", "attention_backend", "cpu_kernel")


def default_setting(name: str) -> Any:
    """EngineConfig's default for `name`: what every entry point uses when not told."""
    return EngineConfig.model_fields[name].default


def engine_settings(**given: Any) -> dict[str, Any]:
    """EngineConfig arguments from an entry point's options: a None means "not given",
    so EngineConfig's default applies, the same one for `resident serve` and `LLM`
    (attention backend `auto`: triton on CUDA, the C kernels on a CPU that runs them,
    else torch; CPU grid kernels `auto`)."""
    return {key: value for key, value in given.items() if value is not None}
