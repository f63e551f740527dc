"""The Textual front end of the agent (`resident` on a terminal). See docs/TUI.md."""

from agent.tui.app import ResidentApp, run_tui

__all__ = ["ResidentApp", "run_tui"]
