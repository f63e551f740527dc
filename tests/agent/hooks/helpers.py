"""Writing hooks files for tests: the user's (under RESIDENT_CONFIG_DIR) and a repository's."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from agent.core.hooks.config import REPOSITORY_FILE
from agent.core.hooks.trust import HookTrust
from tools.sandbox.bubblewrap import Sandbox, detect_sandbox

PYTHON = shlex.quote(sys.executable)


def user_hooks(hooks: dict[str, list[dict[str, Any]]]) -> Path:
    """The user's hooks.json (the test's config dir, set by tests/agent/conftest.py)."""
    path = Path(os.environ["RESIDENT_CONFIG_DIR"]) / "hooks.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"hooks": hooks}))
    return path


def repository_hooks(repo: Path, hooks: dict[str, list[dict[str, Any]]]) -> Path:
    path = repo / REPOSITORY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"hooks": hooks}))
    return path


def trust_repository(repo: Path) -> None:
    """What `resident hooks trust` records, for the file and the scripts it names as they
    are now."""
    from agent.core.hooks.config import read_hooks_file
    from agent.core.hooks.scripts import hooks_coverage

    loaded = read_hooks_file(repo / REPOSITORY_FILE, "repository")
    coverage = hooks_coverage(loaded, repo)  # type: ignore[arg-type]
    HookTrust().trust(repo, coverage.digest, coverage.files)


def python_hook(script: Path, body: str) -> str:
    """A hook command that runs `body` as a Python script with the agent's interpreter."""
    script.write_text(body)
    return f"{PYTHON} {shlex.quote(str(script))}"


def has_sandbox(path: Path) -> bool:
    return isinstance(detect_sandbox(path), Sandbox)
