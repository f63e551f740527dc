"""What the agent's in-process engine runs by default, and where that differs from `resident serve`.

Both engines take every setting from EngineConfig (engine/config.py) unless
told otherwise. `resident serve` is told by SERVE_DEFAULTS
(engine/server/options.py); the agent's engine (clients/local.py start_engine)
by LOCAL_ENGINE_CHOICES below, the one place that says which engine settings
the agent uses differently and why. `compare_with_serve` compares the two,
so the TUI's and the REPL's `/settings` can show them, and
tests/agent/test_agent_config_declared_once.py fails when a serve default
changes and this table does not say how the agent stands to it.

The default model is the engine's (engine/model_files/store.py): the agent
names no model of its own. Torch-free, like the modules it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config import default_setting
from engine.model_files.store import DEFAULT_MODEL_NAME
from engine.server.options import SERVE_DEFAULTS

# The model the agent's local engine loads when none is named.
LOCAL_DEFAULT_MODEL = DEFAULT_MODEL_NAME


@dataclass(frozen=True)
class EngineChoice:
    """An engine setting the agent's engine is started with, and why."""

    setting: str  # an EngineConfig field
    value: Any
    why: str


LOCAL_ENGINE_CHOICES: tuple[EngineChoice, ...] = (
    EngineChoice(
        "kv_disk",
        True,
        "the next session on the same repository state restores the resident prefix's KV "
        "from disk instead of prefilling it (as `resident serve` keeps its cached prefixes "
        "over a restart)",
    ),
    EngineChoice(
        "speculative",
        "prompt_lookup",
        "the agent decodes greedily, and what it writes (edited files, a function with a "
        "line changed) is mostly in its context already, so drafts copied from the context "
        "are often accepted; outputs are the same as without it. A server's clients sample "
        "and ask for their own, so `resident serve` leaves it to each request",
    ),
    EngineChoice(
        "max_waiting",
        None,
        "one person's requests, one at a time: there is no queue to bound, while a server "
        "answers 503 rather than queue without end",
    ),
)


def local_engine_settings() -> dict[str, Any]:
    """The EngineConfig arguments the agent's engine starts with, before any given ones."""
    return {choice.setting: choice.value for choice in LOCAL_ENGINE_CHOICES}


@dataclass(frozen=True)
class SettingDifference:
    setting: str
    agent: Any  # the agent's local engine
    serve: Any  # `resident serve`
    library: Any  # EngineConfig's default (`LLM(...)`)
    why: str


def compare_with_serve() -> list[SettingDifference]:
    """Each engine setting the agent chooses, beside what `resident serve` and the library
    (`LLM(...)`) use, with the agent's reason: the rows `/settings` shows."""
    found = []
    for choice in LOCAL_ENGINE_CHOICES:
        library = default_setting(choice.setting)
        serve = SERVE_DEFAULTS.get(choice.setting, library)
        found.append(SettingDifference(choice.setting, choice.value, serve, library, choice.why))
    return found


def unexplained_serve_differences() -> list[str]:
    """Settings whose default differs between `resident serve` and the agent's engine with
    no entry in LOCAL_ENGINE_CHOICES to say why (the model aside: each names its own)."""
    local = local_engine_settings()
    names = (set(SERVE_DEFAULTS) | set(local)) - {"model"}
    return sorted(
        name
        for name in names
        if name not in local
        and SERVE_DEFAULTS.get(name, default_setting(name)) != default_setting(name)
    )
