"""EngineConfig: every engine setting declared once, in one validated place.

Each field is the one declaration of a setting: its type, default, allowed values
(a Literal, or bounds) and its help (the description). The entry points derive
from it: `resident serve` builds its options from these fields (engine/cli/serve.py,
engine/server/options.py), `LLM(...)` passes None for what it is not told so the
default here applies (`engine_settings`), and the other commands take defaults
and choices through `default_setting` and `setting_choices`. The names of the
KV cache dtypes and of the attention backends are declared by the modules that
implement them (engine/kv/dtypes.py, engine/attention/names.py), torch-free so
that this module stays cheap to import (the CLI's --help reads it).
"""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.attention.names import BACKEND_HELP, BACKEND_NAMES
from engine.errors import EngineError
from engine.kv.dtypes import KV_DTYPES
from engine.kv.kv_events import parse_kv_events

DTypeName = Literal["auto", "bfloat16", "float32"]
KVDTypeName = Literal[("auto", *KV_DTYPES)]  # auto: engine.kv.dtypes.AUTO_KV_DTYPES
AttentionBackendName = Literal[BACKEND_NAMES]
KVRotationName = Literal["auto", "none", "hadamard"]
CPUKernelName = Literal["auto", "int8", "bf16"]
CPUWeightsName = Literal["checkpoint", "q8_0", "q4_0"]
SpeculativeName = Literal["none", "prompt_lookup", "mtp"]
# Default KV budget on CPU when none is given; GPUs size from free memory.
DEFAULT_CPU_KV_GIB = 1.0
_BACKENDS_HELP = "; ".join(f"{name}: {text}" for name, text in BACKEND_HELP.items())


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        description="Model name (see `resident models list`), Hugging Face model folder, "
        "or .gguf file."
    )
    dtype: DTypeName = Field(
        default="auto",
        description="What the model computes in; auto: float32 for a float32 checkpoint, "
        "else bfloat16.",
    )
    kv_cache_dtype: KVDTypeName = Field(
        default="fp8_e4m3",
        description="How the KV cache stores keys and values: fp8_e4m3 holds twice the "
        "tokens of bf16 (scaled per layer or head); auto keeps the model's dtype.",
    )
    attention_backend: AttentionBackendName = Field(
        default="auto", description=f"Attention kernels: {_BACKENDS_HELP}."
    )
    kv_memory_gib: float | None = Field(
        default=None,
        gt=0,
        description="KV cache budget in GiB; default: sized from free GPU memory, "
        f"{DEFAULT_CPU_KV_GIB:g} GiB on CPU.",
    )
    page_size: int = Field(default=16, ge=1, le=1024, description="Tokens per KV page.")
    max_num_seqs: int = Field(default=64, ge=1, description="Sequences in the running batch.")
    max_num_batched_tokens: int = Field(
        default=2048, ge=16, description="Tokens one step computes at most."
    )
    max_model_len: int | None = Field(
        default=None,
        ge=2,
        description="Longest prompt plus output per request; default: the model's limit.",
    )
    kv_scales_file: str | None = Field(
        default=None,
        description="JSON file of KV scales (write one with `resident models calibrate`).",
    )
    # Hadamard rotation of K and V before the cache (DESIGN.md §3).
    kv_rotation: KVRotationName = Field(
        default="auto",
        description="Hadamard rotation of K/V before the cache; auto: hadamard for "
        "fp8_e4m3 unless fixed KV scales were measured without rotation (engine/kv/scales.py).",
    )
    # One FP8 scale per KV head instead of one per layer (GQA; calibration).
    kv_scales_per_head: bool = Field(
        default=False, description="Calibrate one FP8 scale per KV head, not per layer."
    )
    enable_prefix_caching: bool = Field(
        default=True, description="Reuse the KV of prompt prefixes already computed."
    )
    verify_prefix_cache: bool = Field(
        default=False, description="Hash shared pages and check them on reuse."
    )
    max_waiting: int | None = Field(  # None: no limit
        default=None,
        ge=1,
        description="Queued requests beyond which the engine is overloaded (the server says 503).",
    )
    # The disk tier of the prefix cache (engine/kv/prefix_store.py): off for the
    # library, on for the agent's local engine and `resident serve`
    # (engine/server/options.py SERVE_DEFAULTS).
    kv_disk: bool = Field(
        default=False,
        description="Keep cached prefixes' KV on disk: saved when the server stops, "
        "restored when it starts (`resident cache list|clear`).",
    )
    kv_disk_gib: float = Field(default=8.0, gt=0, description="GiB the KV disk tier may hold.")
    kv_disk_dir: str | None = Field(
        default=None,
        description="Folder of the KV disk tier; default: RESIDENT_CACHE_DIR/kv or the user cache.",
    )
    # The host-memory tier that pinned prefix pages spill to when they give way under
    # pool pressure (engine/kv/prefix_spill.py). A CPU pool's pages are host memory
    # already: they spill to the disk tier, if on.
    kv_host_gib: float | None = Field(
        default=None,
        ge=0,
        description="Host memory (GiB) for KV pages of pinned prefixes that give way when "
        "the pool is full; they come back from there instead of being prefilled. 0 turns "
        "it off. Default: min(8, a quarter of RAM) with a GPU pool; off on CPU, where "
        "pages spill to the disk tier.",
    )
    # KV events for cache-aware routers (engine/kv/kv_events.py, kv_event_publisher.py).
    kv_events: str | None = Field(
        default=None,
        description="Publish the prefix cache's KV events (blocks stored, removed, cleared) "
        "over ZMQ as vLLM does, for vllm-router's kv_aware policy or llm-d: an endpoint "
        "(tcp://*:5557 binds every interface, tcp://127.0.0.1:5557 loopback only; another "
        "host is a broker to connect to), or vLLM's --kv-events-config JSON "
        "(enable_kv_cache_events, endpoint, replay_endpoint, topic, buffer_steps, hwm, "
        "max_queue_size). Blocks are KV pages (block size = page size, 16); hashes are "
        "vLLM's sha256_cbor chain, seeded by PYTHONHASHSEED (else 0). vllm-router: --policy "
        "kv_aware --kv-event-source http://HOST:PORT=tcp://HOST:5557 --kv-event-block-size 16 "
        "--kv-event-model NAME. Off by default.",
    )
    seed: int = Field(default=0, description="Seed of the sampler's random numbers.")
    # Batch-, chunk- and cache-invariant reductions (DESIGN.md §3).
    deterministic: bool = Field(
        default=False,
        description="Batch- and cache-invariant outputs: bit-identical however requests "
        "are batched (slower).",
    )
    # Decode steps replayed as CUDA graphs (engine/execution/decode_graphs.py).
    cuda_graphs: bool = Field(
        default=True,
        description="Replay plain decode steps as CUDA graphs, one per batch-size bucket "
        "(one GPU, Triton attention); off runs every step eagerly.",
    )
    # Decode over FP8 KV pages on e4m3 tensor cores (engine/attention/triton/decode_fp8.py,
    # mla_decode.py's FP8_DOT; docs/DECODE_ATTENTION.md).
    fp8_decode_dots: bool = Field(
        default=True,
        description="Decode attention over FP8 KV pages on FP8 tensor cores (Triton "
        "attention, GPUs of compute capability 8.9+), queries and softmax weights rounded to "
        "e4m3; off widens the pages to the activations' dtype instead (exact products, slower).",
    )
    # CPU products with 4-/8-bit grid weights (engine/layers/cpu_grid_weights.py).
    cpu_kernel: CPUKernelName = Field(
        default="auto",
        description="CPU products with 4-/8-bit grid weights: int8 activations (the C "
        "kernel, AVX-512 VNNI or AVX2; fastest), bf16 (torch's int4 kernel), or auto (int8 "
        "where it runs).",
    )
    # Dense CPU weights quantized at load (engine/layers/cpu_weight_quantization.py).
    cpu_weights: CPUWeightsName = Field(
        default="checkpoint",
        description="CPU linear weights that arrive dense (a BF16/FP16/F32 checkpoint, a GGUF's "
        "F16 or K-quant tensors): keep the checkpoint's values (checkpoint), or round them at "
        "load onto llama.cpp's q8_0 or q4_0 grid for the int8 grid kernel (less memory "
        "traffic, faster decode; the quality cost is in docs/BENCHMARKS.md).",
    )
    # Speculative decoding (engine/speculative): SamplingParams.speculative overrides
    # the default per request.
    speculative: SpeculativeName = Field(
        default="none",
        description="Speculative decoding: prompt_lookup (drafts copied from the context, "
        "verified in one pass; same outputs), mtp (drafts from the checkpoint's "
        "multi-token-prediction layers: DeepSeek V3/V3.2, Kimi K2.x, GLM-4.5+, GLM-5.x; "
        "same outputs) or none. A request's `speculative` field overrides it.",
    )
    speculative_mtp_tokens: int = Field(
        default=1,
        ge=1,
        le=8,
        description="With --speculative mtp: tokens each draft holds, the MTP layer chained "
        "on its own output past the first (the released models have one MTP layer, "
        "trained for one token).",
    )
    speculative_max_draft: int = Field(
        default=8,
        ge=1,
        le=64,
        description="Most tokens one draft may hold (drafts grow and shrink below it with "
        "the acceptance rate).",
    )
    # Streamed outputs held and merged for a few ms (engine/requests/pacing.py), so the
    # event loop or TUI that consumes them wakes less often than the engine steps.
    stream_interval_ms: float = Field(
        default=50.0,
        ge=0,
        le=1000,
        description="Longest a streamed request's new tokens wait to be sent together with "
        "the next steps' (ms): its reader wakes at most about 1000/N times a second instead "
        "of every step, which leaves the cores to the model. First and last tokens are never "
        "held; 0 sends every step.",
    )
    device: str | None = Field(
        default=None, description="Device to run on; default: CUDA when available, else CPU."
    )
    # Packed: engine/layers/packed_methods.py.
    quantized_weights: Literal["packed", "dequantized"] = Field(
        default="packed",
        description="FP8 block-scaled and INT4 checkpoints: keep each quantized layer in "
        "the checkpoint's form, or dequantize at load.",
    )
    # Tensor parallelism (engine/distributed, docs/DISTRIBUTED.md): rank 0 is this
    # process (scheduler, cache, server) and starts the workers of its node. Across
    # nodes each node runs tensor_parallel_size / nnodes ranks and meets the others
    # at master_addr:master_port (TCP rendezvous).
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        description="Tensor-parallel ranks: one process per GPU (on CPU, processes "
        "splitting the cores). This process is rank 0 and starts the others of its node.",
    )
    expert_parallel: bool = Field(
        default=False, description="MoE: deal routed experts whole to the ranks (expert parallel)."
    )
    nnodes: int = Field(
        default=1, ge=1, description="Nodes the tensor-parallel ranks are spread over (evenly)."
    )
    node_rank: int = Field(
        default=0,
        ge=0,
        description="This node's index; nodes other than 0 run workers only, no HTTP server.",
    )
    master_addr: str = Field(
        default="127.0.0.1", description="Address of node 0, where the ranks meet (TCP rendezvous)."
    )
    master_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port of the rendezvous on node 0; required with more than one node "
        "(default: a free loopback port).",
    )

    @field_validator("attention_backend", mode="before")
    @classmethod
    def _known_backend(cls, name: Any) -> Any:
        # An EngineError, as get_backend raises, rather than a ValidationError: callers
        # of LLM(...) catch the engine's errors.
        if name not in BACKEND_NAMES:
            raise EngineError(f"attention backend {name!r}: use one of {', '.join(BACKEND_NAMES)}")
        return name

    @field_validator("kv_events")
    @classmethod
    def _kv_events_parse(cls, value: str | None) -> str | None:
        parse_kv_events(value)  # a ValueError names what is wrong with it
        return value

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
        if parse_kv_events(self.kv_events) is not None and not self.enable_prefix_caching:
            raise ValueError("kv_events reports the prefix cache: it needs enable_prefix_caching")
        return self

    @property
    def local_ranks(self) -> int:
        """Ranks (processes) on each node."""
        return self.tensor_parallel_size // self.nnodes


# The settings that decide speed and numerics; `resident serve` (ServeOptions)
# and `LLM(...)` both start from EngineConfig's defaults for them.
PERFORMANCE_SETTINGS = (
    "dtype",
    "kv_cache_dtype",
    "kv_rotation",
    "attention_backend",
    "cpu_kernel",
    "cpu_weights",
)


def default_setting(name: str) -> Any:
    """EngineConfig's default for `name`: what every entry point uses when not told."""
    return EngineConfig.model_fields[name].default


def setting_help(name: str) -> str:
    """The help text of setting `name` (its description)."""
    return EngineConfig.model_fields[name].description or ""


def setting_choices(name: str) -> tuple[Any, ...] | None:
    """The values setting `name` allows when they are a list (its Literal), else None."""
    annotation = EngineConfig.model_fields[name].annotation
    return get_args(annotation) if get_origin(annotation) is Literal else None


def unknown_choice(name: str, value: Any, flag: str) -> str | None:
    """The usage error for a `value` setting `name` does not allow, naming `flag` and
    the allowed values; None when it is allowed (or the setting has no list)."""
    allowed = setting_choices(name)
    if allowed is None or value in allowed:
        return None
    return f"{flag} must be one of {', '.join(map(str, allowed))}, not {value!r}"


def engine_settings(**given: Any) -> dict[str, Any]:
    """EngineConfig arguments from an entry point's options: a None means "not given",
    so EngineConfig's default applies, the same one for `resident serve` and `LLM`
    (attention backend `auto`: triton on CUDA, the C kernels on a CPU that runs them,
    else torch; CPU grid kernels `auto`)."""
    return {key: value for key, value in given.items() if value is not None}
