"""What a router learns about a worker, in the shapes SGLang's server answers and the
routers read (sglang-router 0.3.2, vllm-router 0.1.17).

- `model_info`: SGLang's /model_info (/get_model_info). sglang-router reads
  `model_path`, `tokenizer_path`, `is_generation`, `model_type` and
  `architectures`; a router on this machine loads the tokenizer from the path.
- `server_info`: SGLang's /server_info (/get_server_info): its server arguments
  and scheduler facts under their names. sglang-router takes the model's name
  from `served_model_name` (else `model_path`; without either, `unknown`), and
  reads `tp_size`, `dp_size`, `max_total_tokens`, `max_prefill_tokens`,
  `max_running_requests` and `version`; a field of the wrong type (or a second
  spelling of the model id, `model`) makes it drop the whole answer. vllm-router's
  `kv_aware` discovery reads `kv_block_size` (alias `block_size`) and takes the
  model's name from `model_path`'s last part (src/protocols/worker_spec.rs).
- `load_entries`: SGLang's /get_load, one entry per data-parallel rank:
  `num_reqs` (running and waiting), `num_waiting_reqs`, `num_tokens` (KV tokens
  running requests hold plus the tokens waiting requests still have to compute);
  sglang-router sums `num_tokens` into a worker's load. The KV facts beside them
  are Resident's own.

Pure functions of the served model and the engine's stats or load, so the
shapes are tested without a server.
"""

from __future__ import annotations

import time
from importlib import metadata
from typing import Any

from engine.server.served_model import ServedModel


def resident_version() -> str:
    try:
        return metadata.version("resident")
    except metadata.PackageNotFoundError:
        return "unknown"


def model_info(model: ServedModel) -> dict[str, Any]:
    path = model.model_path or model.id
    return {
        "model_path": path,
        "tokenizer_path": path,  # the folder holds the tokenizer (GGUF files are converted)
        "is_generation": True,
        "served_model_name": model.id,
        "model_type": model.model_type,
        "architectures": list(model.architectures),
        "max_model_len": model.max_context_tokens,  # vLLM's name for the context length
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
    }


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def server_info(model: ServedModel, stats: dict[str, Any]) -> dict[str, Any]:
    """`stats` is the engine's (/v1/engine/stats): sizes in force, not just as configured."""
    settings, parallel = model.settings, stats.get("parallel") or {}
    path = model.model_path or model.id
    capacity = _int(stats.get("capacity_tokens"), model.capacity_tokens)
    batched = _int(settings.get("max_num_batched_tokens"), model.max_context_tokens)
    tp = _int(parallel.get("tp"), _int(settings.get("tensor_parallel_size"), 1))
    page_size = _int(stats.get("page_size"), _int(settings.get("page_size"), 16))
    return {
        "model_path": path,
        "tokenizer_path": path,
        "served_model_name": model.id,
        "version": resident_version(),
        "is_generation": True,
        "tp_size": tp,
        "dp_size": 1,  # one engine per server: replicas are separate servers
        "pp_size": 1,
        "ep_size": _int(parallel.get("ep"), tp if settings.get("expert_parallel") else 1),
        "nnodes": _int(parallel.get("nnodes"), _int(settings.get("nnodes"), 1)),
        "context_length": model.max_context_tokens,
        "max_req_input_len": max(model.max_context_tokens - 1, 1),
        "max_total_num_tokens": capacity,
        "max_total_tokens": capacity,
        "max_running_requests": _int(settings.get("max_num_seqs"), 1),
        "max_prefill_tokens": batched,
        "chunked_prefill_size": batched,
        "page_size": page_size,
        "kv_block_size": page_size,  # vllm-router's name: the KV events' block_size
        "dtype": settings.get("dtype"),
        "kv_cache_dtype": stats.get("kv_cache_dtype"),
        "disable_radix_cache": not settings.get("enable_prefix_caching", True),
        "enable_cache_report": True,  # usage carries prompt_tokens_details.cached_tokens
    }


def load_entries(load: dict[str, Any]) -> list[dict[str, Any]]:
    """`load` is the engine's (ServingEngine.load)."""
    running, waiting = _int(load.get("running"), 0), _int(load.get("waiting"), 0)
    used, capacity = _int(load.get("used_tokens"), 0), _int(load.get("capacity_tokens"), 0)
    return [
        {
            "dp_rank": 0,
            "num_reqs": running + waiting,
            "num_waiting_reqs": waiting,
            "num_tokens": used + _int(load.get("waiting_tokens"), 0),
            "ts_tic": time.perf_counter(),
            "num_running_reqs": running,
            "kv_used_tokens": used,
            "kv_cached_tokens": _int(load.get("cached_tokens"), 0),
            "kv_capacity_tokens": capacity,
            "kv_usage": used / capacity if capacity else 0.0,
        }
    ]
