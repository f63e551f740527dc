"""ServeOptions: what `resident serve` takes, the engine settings derived from EngineConfig.

The server's own options (where it listens, the API key, the log level) are
declared here, once (`ServerOptions`). The engine settings are not: each is an
EngineConfig field (engine/config.py: type, default, allowed values, help), and
the serve entry point says only which settings it exposes (SERVE_SETTINGS), where
its default differs from the library's (SERVE_DEFAULTS) and which flags are not
`--the-field-name` (SERVE_FLAGS). ServeOptions is built from those; the command's
options are built from ServeOptions (engine/cli/serve.py), and
engine/server/launch.py checks them and turns them into the EngineConfig.

Torch-free (as is the engine/server package file), so that `resident serve
--help` does not load the engine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from engine.config import EngineConfig, engine_settings, setting_help
from engine.model_files.store import DEFAULT_MODEL_NAME

API_KEY_ENV = "RESIDENT_API_KEY"

# The EngineConfig settings `resident serve` exposes, in the order of its --help.
SERVE_SETTINGS: tuple[str, ...] = (
    "model",
    "dtype",
    "kv_cache_dtype",
    "kv_rotation",
    "kv_scales_file",
    "kv_scales_per_head",
    "max_num_seqs",
    "max_waiting",
    "kv_memory_gib",
    "deterministic",
    "cuda_graphs",
    "fp8_decode_dots",
    "max_model_len",
    "attention_backend",
    "cpu_kernel",
    "cpu_weights",
    "kv_disk",
    "kv_host_gib",
    "kv_events",
    "speculative",
    "speculative_mtp_tokens",
    "stream_interval_ms",
    "tensor_parallel_size",
    "expert_parallel",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
)
# Where a server wants other defaults than the library: its cached prefixes
# outlive a restart, and a queue that grows without end only delays the 503.
SERVE_DEFAULTS: dict[str, Any] = {
    "model": DEFAULT_MODEL_NAME,
    "kv_disk": True,
    "max_waiting": 1024,
}
# Flags other than `--field-name` (a bool's default is `--name/--no-name`).
SERVE_FLAGS: dict[str, tuple[str, ...]] = {
    "model": ("--model", "-m"),
    "kv_scales_file": ("--kv-scales",),
    "kv_scales_per_head": ("--kv-scales-per-head",),
    "kv_memory_gib": ("--kv-memory",),
    "kv_disk": ("--kv-disk/--no-kv-disk",),
    "tensor_parallel_size": ("--tp",),
    "expert_parallel": ("--ep",),
}


def flag_of(name: str) -> str:
    """The flag that sets option `name`, as usage errors name it (`--kv-memory`)."""
    flags = SERVE_FLAGS.get(name)
    return flags[0].split("/")[0] if flags else "--" + name.replace("_", "-")


@dataclass(kw_only=True)
class ServerOptions:
    """The server's own options; `help` is the command's help for the option."""

    host: str = field(
        default="127.0.0.1", metadata={"help": "Address to bind; non-loopback needs an API key."}
    )
    port: int = field(default=8000, metadata={"help": "TCP port."})
    api_key: str | None = field(
        default=None,
        metadata={"help": "Require `Authorization: Bearer KEY`.", "envvar": API_KEY_ENV},
    )
    log_level: str = "info"  # uvicorn's; no flag


def _setting_field(name: str) -> tuple[str, Any, Any]:
    declared = EngineConfig.model_fields[name]
    default = SERVE_DEFAULTS.get(name, declared.default)
    return name, declared.annotation, field(default=default, metadata={"help": setting_help(name)})


ServeOptions = dataclasses.make_dataclass(
    "ServeOptions",
    [_setting_field(name) for name in SERVE_SETTINGS],
    bases=(ServerOptions,),
    kw_only=True,
    namespace={
        "__module__": __name__,
        "__doc__": "The server's own options and the engine settings `resident serve` "
        "exposes, each defaulting to SERVE_DEFAULTS' value, else EngineConfig's.",
    },
)


def serve_settings(options: Any) -> dict[str, Any]:
    """The EngineConfig arguments `options` (a ServeOptions) give; a None is "not
    given", so EngineConfig's default applies (engine.config.engine_settings)."""
    return engine_settings(**{name: getattr(options, name) for name in SERVE_SETTINGS})
