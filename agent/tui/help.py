"""The TUI's keys and commands, for /help, the footer and docs/TUI.md."""

from __future__ import annotations

from collections.abc import Sequence

from agent.core.commands import SLASH_COMMANDS
from agent.core.custom_commands import CustomCommand

KEYS: tuple[tuple[str, str], ...] = (
    ("Enter", "send the message (or take the highlighted completion)"),
    (
        "ctrl+j",
        "new line in the message (also shift+enter / alt+enter where the terminal sends them)",
    ),
    ("↑ / ↓", "previous / next message from the history (on the first / last line)"),
    ("Tab", "take the highlighted completion; `/` completes commands, `@` files"),
    ("ctrl+c", "interrupt generation and running tools; press again to quit"),
    ("y / a / n", "approval: allow once / allow for this session / deny (then type a reason)"),
    (
        "1 / 2 / 3 / 4",
        "after a plan: carry it out in ask / auto-edit / full-auto, or keep planning",
    ),
    ("ctrl+o", "fold or unfold all tool calls"),
    ("ctrl+t", "fold or unfold the model's thinking"),
    ("ctrl+up", "show earlier tasks of a long conversation"),
    ("Esc", "back to the input box (closes the completion menu)"),
    ("F1", "this help"),
    ("ctrl+q", "quit"),
)


def _cell(text: str) -> str:
    """Text from a command file, safe inside a Markdown table cell."""
    return text.replace("|", "\\|")


def help_markdown(custom: Sequence[CustomCommand] = ()) -> str:
    lines = ["**Commands**", "", "| command | what it does |", "|---|---|"]
    for command in SLASH_COMMANDS:
        usage = f" {command.usage}" if command.usage else ""
        lines.append(f"| `{command.name}{usage}` | {command.help} |")
    if custom:
        lines += [
            "",
            "**Custom commands**",
            "",
            "| command | what it does | from |",
            "|---|---|---|",
        ]
        for c in custom:
            usage = f" {c.argument_hint}" if c.argument_hint else ""
            where = f"{c.origin}: {c.path.name}"
            lines.append(f"| `{_cell(c.slash_name + usage)}` | {_cell(c.description)} | {where} |")
    lines += ["", "**Keys**", "", "| key | what it does |", "|---|---|"]
    lines += [f"| {key} | {what} |" for key, what in KEYS]
    return "\n".join(lines)
