"""AgentConfig: every setting of the agent declared once, in one validated place.

Each field is the one declaration of a setting, as EngineConfig's are for the
engine (engine/config.py): its type, default, allowed values (an enum, or
bounds) and its help (the description). The front ends derive from it:
`resident`, `resident run` and `resident acp` build their options from these
fields (agent/cli/options.py says which command exposes which setting and how
its flag is spelled), `RuntimeOptions.from_config` turns a config into what
the runtime takes (agent/core/runtime.py), RuntimeOptions and AgentSettings
take their defaults from here, and the TUI's and the REPL's `/approval` and
`/settings` list the choices and the help declared here.

The engine settings the agent's own engine chooses differently from `resident
serve` are the engine's, not the agent's: agent/core/clients/engine_profile.py.

Cheap to import (pydantic and the approval modes): the CLI's --help reads it.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tools import ApprovalMode

NETWORK_HELP = (
    "Let shell commands use the network and web_fetch reach public hosts without asking "
    "(off by default; an allow rule 'network:PREFIX' allows it for matching commands only, "
    "'web_fetch:HOST' for one host)."
)


class AgentConfig(BaseModel):
    # Frozen: one config per start; the session changes what it may (the approval
    # mode, the model) on the runtime, not here.
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The order of the fields is the order of every command's --help.
    as_json: bool = Field(default=False, description="Print every event as a JSON line.")
    model: str | None = Field(
        default=None,
        description="Model name (see `resident models list`), Hugging Face model folder, "
        "or .gguf file.",
    )
    attach: str | None = Field(
        default=None, description="URL of an OpenAI-compatible server to use instead."
    )
    api_key: str | None = Field(default=None, description="API key for --attach.")
    context_window: int | None = Field(
        default=None,
        ge=256,
        description="Tokens per request, for servers without /v1/engine/stats.",
    )
    approval: ApprovalMode = Field(
        default=ApprovalMode.ASK,
        description="How tool calls are approved (ask asks; nobody answers in headless "
        "runs; /approval or an editor switches it in a session).",
    )
    max_turns: int = Field(
        default=50, ge=1, description="Model requests allowed per task (in acp: per prompt)."
    )
    max_tokens: int | None = Field(  # None: what the context window leaves
        default=None, ge=1, description="Tokens allowed per answer."
    )
    resume: str | None = Field(default=None, description="Continue the session with this id.")
    continue_last: bool = Field(
        default=False, description="Continue this repository's latest session."
    )
    allow: tuple[str, ...] = Field(
        default=(), description="Allow rule, e.g. 'shell:pytest' (repeatable)."
    )
    deny: tuple[str, ...] = Field(
        default=(), description="Deny rule, e.g. 'shell:git push' (repeatable)."
    )
    # As typed: comma-separated names (tool_names splits them); None offers every tool.
    tools: str | None = Field(
        default=None, description="Offer only these tools, e.g. 'read,grep,list'."
    )
    plain: bool = Field(
        default=False,
        description="Line-by-line prompt instead of the TUI (also when piped).",
    )
    verbose: bool = Field(default=False, description="Log engine details.")
    network: bool = Field(default=False, description=NETWORK_HELP)
    sandbox_env: tuple[str, ...] = Field(
        default=(), description="An environment variable shell commands may see (repeatable)."
    )
    sandbox_read: tuple[Path, ...] = Field(
        default=(), description="A folder shell commands may read, read-only (repeatable)."
    )

    @property
    def tool_names(self) -> tuple[str, ...] | None:
        """The tools to offer, from `--tools`' comma-separated names; None: all of them."""
        if not self.tools:
            return None
        return tuple(name.strip() for name in self.tools.split(",") if name.strip())

    def usage_error(self) -> str | None:
        """What makes this combination of settings unusable, in words for the person who
        typed it (the CLI exits 2 with it); None when there is nothing."""
        if self.model and self.attach is None and self.model.startswith(("http://", "https://")):
            return "--model takes a model name or path; use --attach URL for a server"
        if self.resume and self.continue_last:
            return "use --resume ID or --continue, not both"
        return None


# Every setting at its declared default: where other types (RuntimeOptions,
# AgentSettings) need a default for a setting, they take it from here.
DEFAULTS = AgentConfig()


def default_setting(name: str) -> Any:
    """AgentConfig's default for `name`: what every front end uses when not told."""
    return AgentConfig.model_fields[name].default


def setting_help(name: str) -> str:
    """The help text of setting `name` (its description)."""
    return AgentConfig.model_fields[name].description or ""


def setting_choices(name: str) -> tuple[str, ...] | None:
    """The values setting `name` allows when they are a list (its enum), else None."""
    annotation = AgentConfig.model_fields[name].annotation
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return tuple(member.value for member in annotation)
    return None


def setting_bounds(name: str) -> dict[str, Any]:
    """Setting `name`'s inclusive bounds as {"min": .., "max": ..} (from Field(ge=, le=))."""
    return {
        bound: getattr(constraint, attr)
        for constraint in AgentConfig.model_fields[name].metadata
        for attr, bound in (("ge", "min"), ("le", "max"))
        if hasattr(constraint, attr)
    }
