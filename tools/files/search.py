"""The `list` and `glob` tools: what files exist, honouring .gitignore.

Neither lists Resident's own folders (config, data, cache) when they lie inside the
directory (tools.workspace.walk).
"""

from __future__ import annotations

from pydantic import Field

from tools.base import Arguments, Effect, Tool, ToolAccess, ToolResult
from tools.context import ToolContext
from tools.workspace.globbing import compile_glob
from tools.workspace.paths import PathError, ResolvedPath, resolve_path
from tools.workspace.walk import visible_files


def resolve_directory(raw: str, ctx: ToolContext) -> ResolvedPath:
    target = resolve_path(raw, ctx.allowed_roots)
    if not target.real.is_dir():
        raise PathError(
            f"{raw!r} is not a directory" if target.real.exists() else f"{raw!r} does not exist"
        )
    return target


def display_path(base: ResolvedPath, relative: str) -> str:
    """A walk result as the model should write it back: relative to the workspace."""
    if base.relative.as_posix() == ".":
        return relative if base.in_workspace else str(base.real / relative)
    return f"{base.display}/{relative}"


class ListArgs(Arguments):
    path: str = Field(default=".", description="Directory to list, relative to the workspace.")
    depth: int = Field(default=2, ge=1, le=10, description="How many levels to descend.")


class ListTool(Tool):
    name = "list"
    description = (
        "List a directory as a tree (directories end with '/'), leaving out files that "
        ".gitignore excludes and the .git directory."
    )
    effect = Effect.READ
    Args = ListArgs

    def access(self, args: ListArgs) -> ToolAccess:
        return ToolAccess(effect=self.effect, summary=f"List {args.path}", paths=(args.path,))

    def run(self, args: ListArgs, ctx: ToolContext) -> ToolResult:
        try:
            base = resolve_directory(args.path, ctx)
        except PathError as exc:
            return ToolResult.error(str(exc))
        entries: dict[str, int] = {}  # entry -> number of files under it (0 for files)
        for relative in visible_files(base.root, base.real, ctx.protected_paths):
            parts = relative.split("/")
            for level in range(1, min(len(parts), args.depth + 1)):
                directory = "/".join(parts[:level]) + "/"
                entries[directory] = entries.get(directory, 0) + 1
            if len(parts) <= args.depth:
                entries[relative] = 0
        cap = ctx.limits.list_max_entries
        names = sorted(entries, key=lambda name: name.rstrip("/").split("/"))
        shown = names[:cap]
        lines = []
        for name in shown:
            indent = "  " * (name.rstrip("/").count("/"))
            label = name.rstrip("/").rsplit("/", 1)[-1]
            if name.endswith("/"):
                count = entries[name]
                lines.append(f"{indent}{label}/  ({count} file{'s' if count != 1 else ''})")
            else:
                lines.append(f"{indent}{label}")
        header = f"{base.display}/" if base.display != "." else "./"
        if not names:
            return ToolResult.success(f"{header}\n(no files, or all of them are ignored)")
        truncated = len(names) > cap
        if truncated:
            lines.append(f"[{len(names) - cap:,} more entries not shown; list a subdirectory.]")
        return ToolResult.success(
            header + "\n" + "\n".join(lines), truncated=truncated, entries=len(names)
        )


class GlobArgs(Arguments):
    pattern: str = Field(
        min_length=1,
        description="Glob such as '**/*.py' or 'src/*.{ts,tsx}'. '*' stays within one "
        "directory; '**/' spans directories.",
    )
    path: str = Field(default=".", description="Directory to search from.")


class GlobTool(Tool):
    name = "glob"
    description = (
        "Find files by name pattern, relative to a directory, leaving out files that "
        ".gitignore excludes. Returns matching paths sorted by name."
    )
    effect = Effect.READ
    Args = GlobArgs

    def access(self, args: GlobArgs) -> ToolAccess:
        return ToolAccess(
            effect=self.effect, summary=f"Find {args.pattern} in {args.path}", paths=(args.path,)
        )

    def run(self, args: GlobArgs, ctx: ToolContext) -> ToolResult:
        try:
            base = resolve_directory(args.path, ctx)
        except PathError as exc:
            return ToolResult.error(str(exc))
        regex = compile_glob(args.pattern)
        cap = ctx.limits.glob_max_results
        listed = visible_files(base.root, base.real, ctx.protected_paths)
        matches = sorted(r for r in listed if regex.match(r))
        if not matches:
            return ToolResult.success(f"No files match {args.pattern!r} under {base.display}.")
        shown = [display_path(base, m) for m in matches[:cap]]
        truncated = len(matches) > cap
        if truncated:
            shown.append(f"[{len(matches) - cap:,} more matches not shown; narrow the pattern.]")
        return ToolResult.success("\n".join(shown), truncated=truncated, matches=len(matches))
