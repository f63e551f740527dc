"""`/settings`: the session's settings and the engine settings the agent chooses, in lines.

Shared by the TUI and the REPL, which only show the lines. Everything listed
comes from its one declaration: the agent's settings from AgentConfig
(agent/core/config.py), in its order and with its help; the engine settings
the agent's local engine uses unlike `resident serve` from
agent/core/clients/engine_profile.py, with the reason; the values in force
from the engine itself (a Resident server's /v1/engine/stats, or the local
engine's config).
"""

from __future__ import annotations

from typing import Any

from agent.core.clients.engine_profile import compare_with_serve
from agent.core.config import AgentConfig, setting_help
from agent.core.engine_facts import EngineFacts, engine_facts
from agent.core.runtime import Runtime, RuntimeOptions
from tools import ApprovalMode

# Settings that shape how a front end starts, not the session: not listed.
_NOT_OF_THE_SESSION = frozenset({"as_json", "plain", "verbose", "resume", "continue_last"})


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, ApprovalMode):
        return value.value
    if isinstance(value, tuple):
        return ", ".join(map(str, value)) or "-"
    return str(value)


def agent_setting_lines(
    options: RuntimeOptions, approval: ApprovalMode, model: str | None = None
) -> list[str]:
    """One line per agent setting of the session: its value, then its declared help.
    `model`: the model the session runs, when the options leave it to the engine."""
    config = options.as_config()
    lines = []
    for name in AgentConfig.model_fields:
        if name in _NOT_OF_THE_SESSION:
            continue
        value = getattr(config, name)
        if name == "model" and value is None:
            value = model
        elif name == "approval":
            value = approval  # the mode now: /approval and plan mode change it
        elif name == "api_key":
            value = "set" if value else None  # never shown
        lines.append(f"  {name.replace('_', '-')}: {_shown(value)} - {setting_help(name)}")
    return lines


def engine_setting_lines(facts: EngineFacts | None) -> list[str]:
    """The engine settings the agent's local engine chooses, beside `resident serve`'s and
    the library's, each with why; then what this session's engine runs with."""
    lines = []
    rows = compare_with_serve()
    for row in rows:
        lines.append(
            f"  {row.setting}: {_shown(row.agent)} (resident serve: {_shown(row.serve)}; "
            f"LLM(...): {_shown(row.library)}): {row.why}."
        )
    settings = facts.settings if facts is not None else None
    if settings is None:
        lines.append("This session's engine does not publish its settings.")
    else:
        in_force = ", ".join(f"{r.setting}={_shown(settings.get(r.setting))}" for r in rows)
        lines.append(f"This session's engine ({facts.engine}) runs with {in_force}.")
    return lines


def settings_report(
    options: RuntimeOptions, approval: ApprovalMode, facts: EngineFacts | None
) -> list[str]:
    """Everything `/settings` shows, as lines for a person."""
    return [
        "Agent settings (flags of `resident`, `resident run`, `resident acp`):",
        *agent_setting_lines(options, approval, facts.model if facts is not None else None),
        "Engine settings the agent's local engine uses:",
        *engine_setting_lines(facts),
    ]


async def session_settings(runtime: Runtime, options: RuntimeOptions) -> list[str]:
    """`/settings` for a running session: asks its engine what it runs with."""
    facts = await engine_facts(runtime.client, options.api_key)
    return settings_report(options, runtime.agent.approval_mode, facts)
