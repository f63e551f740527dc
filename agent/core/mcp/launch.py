"""How a server is reached: its stdio command wrapped in the sandbox, or an HTTP client.

A stdio server is a program the agent starts, so it runs like a shell
command does: inside the OS sandbox when there is one (tools/sandbox/bubblewrap.py),
with the environment's allow-list (tools/process/environment.py) plus the entry's
own `env`. The sandbox gives it the workspace read-only, no network, an
empty scratch HOME and /tmp, and the workspace's secret files masked;
the entry's `network`, `write` and `read` grants add to that (for entries
the user trusts, see config.py). The program the entry names is made readable
too, with what it needs to run (program_paths.py): the executable, its `#!`
interpreter, the virtual environment it was installed in and that venv's base
Python, so a server installed outside the workspace starts without a `read`
grant. That is safe because it is only the program the entry names and the
venvs and Python installs it runs from, checked on disk: never a folder the
program merely sits in, the home or above it, or a folder of credentials, and
a secret-looking or non-executable program is refused. A repository's
untrusted entry gets the same rule and no more. Without a sandbox, a server
from the user's own file starts unconfined, as the user would start it, while a
repository's server, trusted or not, does not start at all: unconfined it
could change anything of the user's, their config included; that is the
stance a repository's hooks take.

Before anything starts, a repository's server must be trusted in this
repository as it is now (`trust_refusal`, config.py, trust.py): never
trusted, or trusted before its entry or a file it names changed, it does
not start, sandbox or not, and its reason says what to run. The files are
hashed once more right here, so one rewritten after the config was read
(while the session opened) does not start either.

The read side of every transport is watched for its end, so a server that
exits is noticed when it happens, not at the next call.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import httpx2
from mcp.client import Transport
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from agent.core.mcp.config import ServerConfig, user_config_file
from agent.core.mcp.program_paths import ProgramPaths, ProgramRefused, program_paths
from agent.core.mcp.trust import TRUST_COMMAND
from agent.core.repository_trust import recheck
from tools.process.environment import command_environment
from tools.sandbox.bubblewrap import interpreter_prefixes
from tools.sandbox.grants import CommandSandbox, SandboxError, SandboxGrant, SandboxSettings
from tools.sandbox.mounts import toolchain_dirs

HTTP_TIMEOUT_S = 30.0
HTTP_READ_TIMEOUT_S = 300.0  # a server may hold an event stream open that long


class LaunchRefused(Exception):
    """The server must not start here; the message says why and what would change it."""


def sandbox_label(
    config: ServerConfig, sandbox: CommandSandbox | None, settings: SandboxSettings | None = None
) -> str:
    if config.transport == "http":
        return "none (a remote server)"
    if sandbox is None:
        return "none (no sandbox on this machine)"
    workspace = "writable" if config.write else "read-only"
    network = "on" if config.network or (settings is not None and settings.network) else "off"
    return f"bubblewrap: workspace {workspace}, network {network}"


def stdio_parameters(
    config: ServerConfig,
    workspace: Path,
    sandbox: CommandSandbox | None,
    settings: SandboxSettings,
    base_env: dict[str, str] | None = None,
) -> StdioServerParameters:
    """The process to start for a stdio server. Raises LaunchRefused."""
    base = dict(os.environ if base_env is None else base_env)
    argv = [config.command or "", *config.args]
    if sandbox is None:
        if config.source == "repository":  # trusted or not, as a repository's hooks
            raise LaunchRefused(
                "not started: there is no sandbox to confine a server this repository declares; "
                f"to run it unconfined, copy its entry into your own {user_config_file()}"
            )
        env = command_environment(
            base, home=base.get("HOME"), extra_names=settings.env_names, extra=config.env
        )
        return StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=workspace)
    home = base.get("HOME") or os.path.expanduser("~")
    env = command_environment(
        base, home=home, tmpdir="/tmp", extra_names=settings.env_names, extra=config.env
    )
    program = _program_in_sandbox(config, workspace, settings, base, env)
    try:
        wrapped = sandbox.wrap(
            [program.command, *config.args],
            workspace=workspace,
            cwd=workspace,
            grant=SandboxGrant(write=config.write, network=config.network),
            env=base,
            settings=settings,
            extra_read_only=(*config.read, *program.read_only),
        )
    except SandboxError as err:
        raise LaunchRefused(f"not started: {err}") from err
    return StdioServerParameters(command=wrapped[0], args=wrapped[1:], env=env, cwd=workspace)


def trust_refusal(config: ServerConfig, workspace: Path) -> str | None:
    """Why a repository's server must not start, or None (the user's own, or trusted and
    unchanged since)."""
    if config.source != "repository":
        return None
    command = f"`{TRUST_COMMAND} {config.name}` in this repository"
    if config.trust_state == "untrusted":
        return (
            f"not started: servers a repository declares run only once you trust them; read "
            f"its entry in {config.file} and what it runs, then run {command}"
        )
    changed = list(config.changed)
    if config.trust_state == "trusted" and config.coverage is not None:
        changed = recheck(config.coverage, workspace)
    if config.trust_state == "changed" or changed:
        what = ", ".join(changed) if changed else "its entry"
        return (
            f"not started: {what} changed since you trusted it; read it again, then run {command}"
        )
    return None


def _program_in_sandbox(
    config: ServerConfig,
    workspace: Path,
    settings: SandboxSettings,
    base: dict[str, str],
    env: dict[str, str],
) -> ProgramPaths:
    """The server's program and what it needs, found on the PATH the server gets; what the
    sandbox shows anyway (the grants, the toolchains on the agent's PATH) is not mounted
    twice. Raises LaunchRefused."""
    raw_home = base.get("HOME") or os.path.expanduser("~")
    home = Path(os.path.realpath(raw_home)) if os.path.isabs(raw_home) else None
    home = None if home == Path("/") else home  # as the sandbox takes it: no home to hide
    real_workspace = Path(os.path.realpath(workspace))
    shown = (
        *config.read,
        *settings.read_only_paths,
        *toolchain_dirs(base.get("PATH", ""), home, real_workspace),
        *interpreter_prefixes(),
    )
    try:
        return program_paths(
            config.command or "",
            search_path=env.get("PATH", ""),
            workspace=real_workspace,
            home=home,
            visible=shown,
        )
    except ProgramRefused as err:
        raise LaunchRefused(f"not started: {err}") from err


class _EndWatch:
    """A transport's read stream that calls `on_end` when the server's side closes."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    def __getattr__(self, name: str) -> Any:  # last_context, close, statistics, ...
        return getattr(self._inner, name)

    async def __aenter__(self) -> _EndWatch:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)

    def __aiter__(self) -> _EndWatch:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except StopAsyncIteration:
            self._on_end()
            raise

    async def receive(self) -> Any:
        return await self._inner.receive()

    async def aclose(self) -> None:
        await self._inner.aclose()


@asynccontextmanager
async def _watched(inner: Transport, on_end: Callable[[], None]) -> AsyncIterator[Any]:
    async with inner as (read, write):
        yield _EndWatch(read, on_end), write


@asynccontextmanager
async def _http(config: ServerConfig) -> AsyncIterator[Any]:
    timeout = httpx2.Timeout(HTTP_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S)
    async with httpx2.AsyncClient(headers=dict(config.headers), timeout=timeout) as http:
        async with streamable_http_client(config.url or "", http_client=http) as streams:
            yield streams


def open_transport(
    config: ServerConfig,
    workspace: Path,
    sandbox: CommandSandbox | None,
    settings: SandboxSettings,
    errlog: IO[str],
    on_end: Callable[[], None],
) -> Transport:
    """The transport to the server (not yet entered). Raises LaunchRefused."""
    refusal = trust_refusal(config, workspace)
    if refusal is not None:
        raise LaunchRefused(refusal)
    if config.transport == "http":
        return _watched(_http(config), on_end)
    params = stdio_parameters(config, workspace, sandbox, settings)
    return _watched(stdio_client(params, errlog=errlog), on_end)
