"""The routers `resident bench routing` puts in front of its replicas: sglang-router and
vllm-router as their PyPI wheels install them (0.3.2 and 0.1.17 checked), found
beside this Python or on PATH, their policies, the command that starts one in
front of the replicas, and when it is ready (every worker healthy, and for
sglang-router registered under the model's name, read from the worker's
/server_info).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import httpx

from engine.devtools.benchmarks.measured_process import Running

_ROUTER_READY_S = 180.0


class RoutingUsageError(ValueError):
    """A router that is not installed, a policy it does not have: exit code 2."""


@dataclass(frozen=True)
class RouterKind:
    name: str
    package: str  # what `pip install` takes
    binary: str
    subcommand: tuple[str, ...]
    policies: tuple[str, ...]  # measured by default
    accepted: tuple[str, ...]  # what its --policy takes
    log_level: str
    named: bool  # registers workers under the model's name (ready once it has)
    token_ids: bool  # takes a completion's prompt as token ids


ROUTERS = {
    "sglang": RouterKind(
        "sglang",
        "sglang-router",
        "sglang-router",
        ("launch",),
        ("round_robin", "cache_aware", "manual"),
        ("random", "round_robin", "cache_aware", "power_of_two", "manual"),
        "warn",
        True,
        False,  # 0.3.2: a prompt is a string or a list of strings (422 otherwise)
    ),
    "vllm": RouterKind(
        "vllm",
        "vllm-router",
        "vllm-router",
        (),
        ("round_robin", "cache_aware", "consistent_hash", "kv_aware"),
        ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash")
        + ("sticky_least_loaded",),
        "warning",
        False,
        True,
    ),
}


def environment_bin() -> Path:
    """Where this Python's environment keeps its console scripts."""
    return Path(sys.executable).parent


def find_router(name: str) -> Path:
    """The router's binary: beside this Python (its environment), else on PATH."""
    kind = ROUTERS[name]
    beside = environment_bin() / kind.binary
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which(kind.binary)
    if found:
        return Path(found)
    raise RoutingUsageError(
        f"--router {name}: `{kind.binary}` is neither beside {sys.executable} nor on PATH; "
        f"install it with `pip install {kind.package}`"
    )


def router_version(name: str) -> str | None:
    try:
        return metadata.version(ROUTERS[name].package)
    except metadata.PackageNotFoundError:
        return None


def router_command(
    name: str, binary: Path, policy: str, port: int, metrics_port: int, workers: list[str],
    kv_sources: dict[str, str], block_size: int, model_id: str,
) -> list[str]:  # fmt: skip
    kind = ROUTERS[name]
    command = [str(binary), *kind.subcommand, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--policy", policy, "--worker-urls", *workers, "--log-level", kind.log_level]
    command += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
    if policy == "kv_aware":
        command += ["--kv-event-block-size", str(block_size), "--kv-event-model", model_id]
        for url in workers:
            command += ["--kv-event-source", f"{url}={kv_sources[url]}"]
    return command


def check_policies(chosen: dict[str, tuple[str, ...]], form: str) -> None:
    for name, policies in chosen.items():
        if form == "token-ids" and not ROUTERS[name].token_ids:
            raise RoutingUsageError(
                f"{ROUTERS[name].package} takes no token-id prompts: measure it with chat"
            )
        unknown = sorted(set(policies) - set(ROUTERS[name].accepted))
        if unknown:
            raise RoutingUsageError(
                f"{ROUTERS[name].package} has no policy {', '.join(unknown)}; "
                f"it takes {', '.join(ROUTERS[name].accepted)}"
            )


def wait_router(router: Running, url: str, workers: int, named: bool) -> None:
    deadline = time.monotonic() + _ROUTER_READY_S
    with httpx.Client(base_url=url, timeout=5) as client:
        while True:
            if not router.alive():
                raise RuntimeError(f"the router exited: {router.log_tail()}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                reply = client.get("/workers")
                listed = reply.json().get("workers", []) if reply.status_code == 200 else []
                healthy = [w for w in listed if w.get("is_healthy")]
                if len(healthy) == workers and not (
                    named and any(w.get("model_id") in (None, "unknown") for w in healthy)
                ):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the router had no healthy workers: {router.log_tail()}")
            time.sleep(0.25)
