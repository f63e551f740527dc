"""Slash commands over ACP: the list an editor offers (`available_commands_update`),
and the built-in commands a prompt may run.

Of the built-in commands only those that need no screen of the TUI's and are
not the editor's own business make sense here: `/compact` and `/mcp`. The
approval mode is the session mode (`session/set_mode`), sessions are the
editor's (`session/list`, `session/load`, a new thread for `/clear`), and
`/model`, `/context`, `/diff`, `/undo`, `/sessions`, `/help` and `/quit` are
the TUI's. Custom commands (agent/core/custom_commands.py) come after them.
A command's help is the built-in's own (SLASH_COMMANDS), never a copy.
"""

from __future__ import annotations

from collections.abc import Sequence

from acp.schema import (
    AvailableCommand,
    AvailableCommandInput,
    AvailableCommandsUpdate,
    UnstructuredCommandInput,
)

from agent.core.commands import SlashCommand, find_command, mcp_report
from agent.core.custom_commands import CustomCommand, parse_invocation
from agent.core.runtime import Runtime

ACP_BUILTINS: tuple[str, ...] = ("/compact", "/mcp")
ARGUMENTS_HINT = "arguments"  # for a command that takes some and names none


def builtin_commands() -> list[SlashCommand]:
    commands = [find_command(name) for name in ACP_BUILTINS]
    missing = [n for n, c in zip(ACP_BUILTINS, commands, strict=True) if c is None]
    if missing:  # a built-in renamed or removed: this list must follow
        raise LookupError(f"no built-in command {', '.join(missing)}")
    return [c for c in commands if c is not None]


def _custom(command: CustomCommand) -> AvailableCommand:
    hint = command.argument_hint or ARGUMENTS_HINT
    wanted = AvailableCommandInput(UnstructuredCommandInput(hint=hint))
    return AvailableCommand(
        name=command.name,
        description=command.description,
        input=wanted if command.takes_arguments else None,
    )


def available_commands(custom: Sequence[CustomCommand]) -> list[AvailableCommand]:
    """The commands an editor offers after `/`: the built-ins that work here, then the
    custom ones. ACP names them without the slash."""
    builtins = [
        AvailableCommand(name=c.name.removeprefix("/"), description=c.help)
        for c in builtin_commands()
    ]
    return builtins + [_custom(c) for c in custom]


def commands_update(commands: list[AvailableCommand]) -> AvailableCommandsUpdate:
    return AvailableCommandsUpdate(
        session_update="available_commands_update", available_commands=commands
    )


def acp_builtin(text: str) -> SlashCommand | None:
    """The built-in command a prompt runs, if it is one of those offered here."""
    parsed = parse_invocation(text)
    if parsed is None or "/" + parsed[0] not in ACP_BUILTINS:
        return None
    return find_command("/" + parsed[0])


async def run_builtin(command: SlashCommand, runtime: Runtime) -> str:
    """Run a built-in command of ACP_BUILTINS; the answer to show the user."""
    if command.name == "/compact":
        done = await runtime.agent.compact()
        return "Compacted the conversation." if done else "Nothing was compacted."
    if command.name == "/mcp":
        return "\n".join(mcp_report(runtime))
    raise LookupError(f"{command.name} is not offered over ACP")
