"""What `/mcp` and `resident mcp list` show: each server, its state and its tools.

Plain data in, lines or JSON out, so the TUI, the REPL and the CLI say the
same thing. Header values and environment values are never shown: they
usually hold tokens.
"""

from __future__ import annotations

from typing import Any

from agent.core.mcp.config import REPOSITORY_FILE, ConfigProblem, user_config_file
from agent.core.mcp.status import ServerStatus, State

MAX_DESCRIPTION = 100


def _short(text: str, limit: int = MAX_DESCRIPTION) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status_lines(
    statuses: list[ServerStatus], problems: list[ConfigProblem], *, tools: bool = True
) -> list[str]:
    if not statuses and not problems:
        return [
            f"No MCP servers configured. Declare them in {user_config_file()} or in the "
            f'repository\'s {REPOSITORY_FILE} ({{"mcpServers": {{...}}}}; see docs/MCP.md).'
        ]
    lines: list[str] = []
    for status in statuses:
        count = len(status.tools)
        what = f"{count} tool{'s' if count != 1 else ''}" if status.state is State.READY else ""
        head = f"{status.name}  {status.transport}  {status.state.value}"
        lines.append(f"{head}  {what}".rstrip() if what else head)
        lines.append(f"    {status.target}  ({status.source}; sandbox: {status.sandbox})")
        if status.reason and status.state is not State.READY:
            lines.append(f"    reason: {status.reason}")
        if tools and status.state is State.READY:
            for tool in status.tools:
                lines.append(f"    {tool.name}  {_short(tool.description)}")
        for skipped in status.skipped:
            lines.append(f"    skipped: {skipped}")
        for note in status.notes:
            lines.append(f"    note: {note}")
    for problem in problems:
        lines.append(f"config error: {problem.describe()}")
    return lines


def status_json(statuses: list[ServerStatus], problems: list[ConfigProblem]) -> dict[str, Any]:
    return {
        "servers": [
            {
                "name": s.name,
                "transport": s.transport,
                "source": s.source,
                "target": s.target,
                "sandbox": s.sandbox,
                "state": s.state.value,
                "reason": s.reason,
                "tools": [
                    {"name": t.name, "server_name": t.original, "description": t.description}
                    for t in s.tools
                ],
                "skipped": list(s.skipped),
                "notes": list(s.notes),
            }
            for s in statuses
        ],
        "problems": [
            {"file": str(p.file), "server": p.server, "message": p.message} for p in problems
        ],
    }
