"""How a tool call looks to an ACP client: its kind, title, locations and content.

The client draws tool calls by `kind` (read, edit, search, execute, ...) and
a short `title`; `locations` let it follow along in the files; `content`
is what it shows inside: a diff for file changes (the before and after
texts, which the client renders), the output as text otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from acp import text_block, tool_content, tool_diff_content
from acp.schema import ToolCallLocation, ToolKind

from agent.core.approval_preview import CommandPreview, DiffPreview, Preview
from tools.schema import load_arguments

# The client's icons and grouping; MCP and unknown tools are "other".
TOOL_KINDS: dict[str, ToolKind] = {
    "read": "read",
    "write": "edit",
    "edit": "edit",
    "list": "search",
    "glob": "search",
    "grep": "search",
    "shell": "execute",
    "git_status": "read",
    "git_diff": "read",
    "git_log": "read",
    "git_commit": "execute",
    "web_fetch": "fetch",
    "task": "think",
}
VERBS = {"read": "Read", "write": "Write", "edit": "Edit", "list": "List"}
MAX_TITLE_CHARS = 100
# A tool's output as the model sees it can be 100k characters; the client shows a
# readable head of it (the model and the session journal keep it whole).
MAX_OUTPUT_CHARS = 8000

ToolContent = Any  # acp's ContentToolCallContent | FileEditToolCallContent


def parse_arguments(raw: str) -> dict[str, Any]:
    """A call's arguments as a dict; {} when the model sent something else."""
    try:
        value = load_arguments(raw) if raw.strip() else {}
    except ValueError:  # not JSON, or too deeply nested to read safely
        return {}
    return value if isinstance(value, dict) else {}


def tool_kind(name: str) -> ToolKind:
    return TOOL_KINDS.get(name, "other")


def _short(text: str, limit: int = MAX_TITLE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tool_title(name: str, args: dict[str, Any]) -> str:
    """A few words on what the call does: "Edit calc.py", "Run `pytest -q`"."""
    command, path, pattern = args.get("command"), args.get("path"), args.get("pattern")
    if name == "shell" and isinstance(command, str):
        return _short(f"Run `{command}`")
    if name in VERBS:
        return _short(f"{VERBS[name]} {path if isinstance(path, str) and path else '.'}")
    if name in ("glob", "grep") and isinstance(pattern, str):
        where = f" in {path}" if isinstance(path, str) and path else ""
        return _short(f"{name.capitalize()} {pattern}{where}")
    if name.startswith("git_"):
        return _short(f"git {name[4:]}")
    if name == "web_fetch" and isinstance(args.get("url"), str):
        return _short(f"Fetch {args['url']}")
    if name == "task" and isinstance(args.get("description"), str):
        return _short(f"Subagent: {args['description']}")
    if args:
        shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
        return _short(f"{name}({shown})")
    return name


def absolute(workspace: Path, path: str) -> str:
    """ACP paths are absolute; the model's are relative to the workspace."""
    return str(Path(path) if Path(path).is_absolute() else workspace / path)


def tool_locations(workspace: Path, args: dict[str, Any]) -> list[ToolCallLocation] | None:
    path = args.get("path")
    if not isinstance(path, str) or not path:
        return None
    offset = args.get("offset")
    line = offset if isinstance(offset, int) and offset > 0 else None
    return [ToolCallLocation(path=absolute(workspace, path), line=line)]


def preview_content(preview: Preview, workspace: Path) -> list[ToolContent]:
    """What a call would do, for the permission request and the pending call."""
    if isinstance(preview, DiffPreview):
        old = preview.before if preview.before else None  # None: a new file
        return [tool_diff_content(absolute(workspace, preview.path), preview.after, old)]
    if isinstance(preview, CommandPreview):
        where = f" (in {preview.workdir})" if preview.workdir else ""
        return [tool_content(text_block(f"```sh\n{preview.command}\n```{where}"))]
    return []


def output_content(name: str, output: str, data: dict[str, Any]) -> list[ToolContent]:
    """A finished call's output: a file change's diff fenced as one, a command's output
    as a code block, anything else as text."""
    if not output:
        return []
    diff = data.get("diff")
    if isinstance(diff, str) and diff:
        headline = output.split("\n", 1)[0]
        return [tool_content(text_block(f"{headline}\n```diff\n{_cut(diff)}\n```"))]
    shown = _cut(output)
    if tool_kind(name) == "execute":
        shown = f"```\n{shown}\n```"
    return [tool_content(text_block(shown))]


def _cut(text: str) -> str:
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return text[:MAX_OUTPUT_CHARS] + f"\n… ({len(text):,} characters; the model saw them all)"
