"""Each file Resident reads on its own, put in a hostile shape and read the way a session,
`resident hooks list` or a command's discovery reads it.

`PROBES[name]` is (where the file goes, how it is read). The read returns what a
person is told about the file (a problem, a skip, a warning), or "" when it is
quietly left out. Run in-process by the tests, or in a child with
`python -m tests.agent.bounded_probes NAME WORKSPACE CONFIG_DIR` (for the link to
/dev/zero, so a reader that reads it whole fails there, not in pytest).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from agent.core.context.agents_md import read_agents_files
from agent.core.custom_commands import discover
from agent.core.hooks.config import load_hooks
from agent.core.hooks.trust import HookTrust
from agent.core.mcp.config import load_config
from tools.workspace.ignore import read_rules_file

Read = Callable[[Path, Path], str]


def _hooks(workspace: Path, config: Path) -> str:
    loaded = load_hooks(workspace, config / "hooks.json")
    assert loaded.user is None and loaded.repository is None
    return "\n".join(problem.describe() for problem in loaded.problems)


def _mcp(workspace: Path, config: Path) -> str:
    loaded = load_config(workspace, config / "mcp.json")
    assert loaded.servers == {}
    return "\n".join(problem.describe() for problem in loaded.problems)


def _trust(workspace: Path, config: Path) -> str:
    told: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: told.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("agent.core.hooks.trust")
    logger.addHandler(handler)
    try:
        records = HookTrust(config / "trusted-hooks.json").records()
    finally:
        logger.removeHandler(handler)
    assert records == {}  # fail closed: nothing is trusted
    return "\n".join(told)


def _commands(workspace: Path, config: Path) -> str:
    found = discover(workspace, config / "commands")
    assert found.commands == ()
    return "\n".join(found.problems)


def _agents_md(workspace: Path, config: Path) -> str:
    found = read_agents_files(workspace)
    notes = [f"{path}: {why}" for path, why in found.skipped]
    notes += [text.splitlines()[-1] for _, text in found.texts]  # the line saying it was cut
    return "\n".join(notes)


def _residentignore(workspace: Path, config: Path) -> str:
    rules = read_rules_file(workspace, PurePosixPath(".residentignore"))
    return f"{len(rules)} rules"


PROBES: dict[str, tuple[str, Read]] = {
    # name: (the file, relative to WORKSPACE/ or CONFIG/, and how it is read)
    "repository hooks.json": ("WORKSPACE/.resident/hooks.json", _hooks),
    "user hooks.json": ("CONFIG/hooks.json", _hooks),
    "repository mcp.json": ("WORKSPACE/.resident/mcp.json", _mcp),
    "user mcp.json": ("CONFIG/mcp.json", _mcp),
    "trust records": ("CONFIG/trusted-hooks.json", _trust),
    "repository command": ("WORKSPACE/.resident/commands/review.md", _commands),
    "user command": ("CONFIG/commands/review.md", _commands),
    "AGENTS.md": ("WORKSPACE/AGENTS.md", _agents_md),
    ".residentignore": ("WORKSPACE/.residentignore", _residentignore),
}


def place(name: str, workspace: Path, config: Path) -> Path:
    where, _ = PROBES[name]
    root, _, rest = where.partition("/")
    return (workspace if root == "WORKSPACE" else config) / rest


def probe(name: str, workspace: Path, config: Path) -> str:
    return PROBES[name][1](workspace, config)


if __name__ == "__main__":
    name, workspace, config = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    print(probe(name, workspace, config))
