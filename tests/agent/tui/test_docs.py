"""docs/TUI.md documents every command and key the TUI has."""

from __future__ import annotations

from pathlib import Path

from agent.core.commands import SLASH_COMMANDS
from agent.tui.help import KEYS, help_markdown

DOC = Path(__file__).resolve().parents[3] / "docs" / "TUI.md"


def test_every_command_and_key_is_documented():
    text = DOC.read_text(encoding="utf-8")
    for command in SLASH_COMMANDS:
        usage = f" {command.usage}" if command.usage else ""
        assert f"`{command.name}{usage}`" in text, command.name
    for key, what in KEYS:
        assert f"| {key} | {what} |" in text, key
    help_text = help_markdown()
    assert all(command.name in help_text for command in SLASH_COMMANDS)
