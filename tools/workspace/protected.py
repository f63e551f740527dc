"""Resident's own configuration and state: a trust zone no tool the model drives may change.

Two kinds of place hold what a later session obeys without asking:

- the user's folders (state dirs): the config folder (your hooks, which run
  unconfined in every repository; your MCP servers; custom commands; the
  records of which repositories' hooks and servers you trusted), the data
  folder (session journals that `--continue` replays, checkpoints that
  `/undo` writes back) and the cache (compiled CPU kernels loaded into the
  agent, models, KV pages the engine restores). They usually lie outside
  every workspace, but not when Resident runs in `$HOME` or `~/.config`, or
  when `RESIDENT_*_DIR` points into a project: so they are found by real
  path, wherever they are, never by where the workspace happens to be;
- a repository's own config (`.resident/`, `.residentignore`): its hooks and
  MCP servers (which need the person's trust to run) and its custom
  commands and ignore rules (which need none).

The file tools never write into a state dir and ask by name, every time,
before writing project config (tools.permissions.policy); the sandbox keeps
both read-only for every command, hook and MCP server (tools.sandbox.mounts).
This module only says where they are and what a path is; it decides nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.workspace.paths import ResolvedPath

APP = "resident"
CONFIG_DIR_ENV = "RESIDENT_CONFIG_DIR"
DATA_DIR_ENV = "RESIDENT_DATA_DIR"
CACHE_DIR_ENV = "RESIDENT_CACHE_DIR"
# A repository's Resident configuration, relative to its root.
PROJECT_CONFIG = (".residentignore", ".resident")
PROJECT_CONFIG_DIR = ".resident"


@dataclass(frozen=True)
class StateDir:
    """One of the user's Resident folders, by real path."""

    path: Path
    what: str  # for a sentence: "your Resident configuration (hooks, MCP servers, ...)"
    # Holds what must not be read unasked either (tokens in mcp.json, whole journals).
    private: bool

    def holds(self, real: Path) -> bool:
        return real == self.path or self.path in real.parents


_CONFIG = "your Resident configuration (hooks, MCP servers, commands, trust records)"
_DATA = "Resident's data (session journals, checkpoints)"
_CACHE = "Resident's cache (compiled kernels, models, KV pages)"


def _xdg(env: Mapping[str, str], variable: str, fallback: str) -> str | None:
    """A folder as platformdirs places it on Linux and the BSDs: $XDG_..., else under HOME."""
    chosen = env.get(variable, "").strip()
    if chosen and os.path.isabs(chosen):
        return chosen
    home = env.get("HOME") or os.path.expanduser("~")
    if not home or not os.path.isabs(home):
        return None
    return os.path.join(home, fallback)


def _candidates(env: Mapping[str, str]) -> list[tuple[str | None, str, bool]]:
    """(folder, what, private) as `env` places them; overrides first."""
    config = _xdg(env, "XDG_CONFIG_HOME", ".config")
    data = _xdg(env, "XDG_DATA_HOME", os.path.join(".local", "share"))
    cache = _xdg(env, "XDG_CACHE_HOME", ".cache")
    return [
        (env.get(CONFIG_DIR_ENV) or None, _CONFIG, True),
        (os.path.join(config, APP) if config else None, _CONFIG, True),
        (env.get(DATA_DIR_ENV) or None, _DATA, True),
        (os.path.join(data, APP) if data else None, _DATA, True),
        (env.get(CACHE_DIR_ENV) or None, _CACHE, False),
        (os.path.join(cache, APP) if cache else None, _CACHE, False),
    ]


def _platform_candidates() -> list[tuple[str | None, str, bool]]:
    """Where platformdirs puts them for this process (macOS and Windows differ from XDG):
    the agent's own code reads its config and data from there."""
    import platformdirs

    return [
        (platformdirs.user_config_dir(APP), _CONFIG, True),
        (platformdirs.user_data_dir(APP), _DATA, True),
        (platformdirs.user_cache_dir(APP), _CACHE, False),
    ]


def find_state_dirs(env: Mapping[str, str] | None = None) -> tuple[StateDir, ...]:
    """Every folder of the user's Resident state, as `env` (the environment the tools
    act for) and this process would place it: both, so a tool context built for
    another environment than the agent's own still protects what the agent reads."""
    found: dict[Path, StateDir] = {}
    sources = [*_candidates(os.environ), *_platform_candidates()]
    if env is not None and env is not os.environ:
        sources = [*_candidates(env), *sources]
    for raw, what, private in sources:
        if not raw:
            continue
        real = Path(os.path.realpath(os.path.expanduser(raw)))
        if real == Path("/"):  # a misconfiguration; protecting "/" would forbid every write
            continue
        known = found.get(real)
        if known is None or (private and not known.private):
            found[real] = StateDir(real, what, private)
    return tuple(found.values())


def state_dir_of(real: Path, dirs: Iterable[StateDir]) -> StateDir | None:
    """The state dir holding the real path `real`, or None."""
    return next((d for d in dirs if d.holds(real)), None)


def is_project_config(path: ResolvedPath) -> bool:
    """Whether a resolved path is (inside) a repository's Resident config: `.resident/`
    at any depth (a folder opened on its own reads its own), a `.residentignore`, or
    what a `.resident` link in the root leads to."""
    parts = path.relative.parts
    if PROJECT_CONFIG_DIR in parts or (parts and parts[-1] == PROJECT_CONFIG[0]):
        return True
    for name in PROJECT_CONFIG:
        link = path.root / name
        if link.is_symlink():
            target = Path(os.path.realpath(link))
            if path.real == target or target in path.real.parents:
                return True
    return False


def state_dirs_inside(roots: Sequence[Path], dirs: Iterable[StateDir]) -> list[StateDir]:
    """The state dirs strictly inside one of `roots` (Resident opened in $HOME)."""
    return [d for d in dirs if any(root in d.path.parents for root in roots)]


def describe(state: StateDir) -> str:
    """`/home/u/.config/resident (your Resident configuration (...))`, for a message."""
    return f"{state.path} ({state.what})"
