"""Trust in a repository's hooks covers the scripts they run: a rewritten script is untrusted,
at the next session and in the running one."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.core.hooks.active import active_hooks
from agent.core.hooks.config import load_hooks
from agent.core.hooks.dispatch import Hooks
from agent.core.hooks.scripts import hooks_coverage
from agent.core.hooks.trust import HookTrust
from agent.core.repository_trust import named_files, shell_words
from tests.agent.hooks.helpers import has_sandbox, repository_hooks, trust_repository
from tools import ApprovalMode
from tools.sandbox.bubblewrap import detect_sandbox


def test_the_files_a_command_names_are_found(tmp_path):
    ws = Path(os.path.realpath(tmp_path))
    for rel in ("scripts/guard.sh", "lint.py", "pkg/check/__main__.py", "log.txt"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text("x")
    command = (
        "sh ./scripts/guard.sh && python lint.py --config=pkg/conf.toml; "
        "python -m pkg.check 2>&1 >> log.txt; ./scripts/missing.sh | tee -a out.txt; "
        "cat /etc/passwd ../outside.sh $HOME/x.sh"
    )
    found = named_files(shell_words(command), ws)
    # Named and absent still counts (creating it later is a change); output targets do not.
    assert found == [
        "lint.py",
        "pkg/check/__main__.py",
        "pkg/conf.toml",
        "scripts/guard.sh",
        "scripts/missing.sh",
    ]


def test_a_rewritten_script_is_no_longer_trusted(repo):
    (repo / "guard.sh").write_text("exit 0\n")
    repository_hooks(repo, {"pre_tool": [{"command": "sh guard.sh", "name": "guard"}]})
    trust_repository(repo)
    config = load_hooks(repo)
    assert [h.name for h in active_hooks(config, repo, sandboxed=True).hooks] == ["guard"]

    (repo / "guard.sh").write_text("exit 0\nsh payload.sh\n")  # the model's rewrite
    active = active_hooks(load_hooks(repo), repo, sandboxed=True)
    assert active.hooks == []
    (notice,) = active.notices
    assert "guard.sh (which its hooks run) changed since you trusted it" in notice.message
    assert "resident hooks trust" in notice.message


def test_a_record_of_the_file_alone_still_holds_for_hooks_that_name_no_script(repo):
    from agent.core.hooks.config import digest

    path = repository_hooks(repo, {"user_prompt": [{"command": "date"}]})
    HookTrust().trust(repo, digest(path.read_bytes()))  # what older versions recorded
    assert hooks_coverage(load_hooks(repo).repository, repo).files == {}  # type: ignore[arg-type]
    assert len(active_hooks(load_hooks(repo), repo, sandboxed=True).hooks) == 1


def test_trust_prints_what_it_covers(repo):
    (repo / "guard.sh").write_text("exit 0\n")
    repository_hooks(repo, {"pre_tool": [{"command": "sh guard.sh"}]})
    result = CliRunner().invoke(app, ["hooks", "trust", "-w", str(repo)])
    assert result.exit_code == 0, result.output
    assert "Covered with it" in result.output and '"guard.sh"' in result.output
    listed = CliRunner().invoke(app, ["hooks", "list", "-w", str(repo)])
    assert "trusted" in listed.output and "NOT" not in listed.output
    (repo / "guard.sh").write_text("exit 1\n")
    listed = CliRunner().invoke(app, ["hooks", "list", "-w", str(repo)])
    assert "CHANGED since you trusted it" in listed.output


def _sandbox_here() -> bool:
    with tempfile.TemporaryDirectory(prefix="resident-probe-") as empty:
        return has_sandbox(Path(empty))


@pytest.mark.skipif(not _sandbox_here(), reason="no bubblewrap sandbox here")
def test_a_script_rewritten_during_the_session_stops_the_repositorys_hooks(repo):
    (repo / "guard.sh").write_text("echo ran >&2; exit 2\n")
    repository_hooks(repo, {"pre_tool": [{"command": "sh guard.sh", "name": "guard"}]})
    trust_repository(repo)
    active = active_hooks(load_hooks(repo), repo, sandboxed=True)
    assert active.guard is not None
    events: list = []
    hooks = Hooks(
        active.hooks,
        workspace=repo,
        session_id="s",
        emit=events.append,
        approval=lambda: ApprovalMode.AUTO_EDIT,
        sandbox=detect_sandbox(repo),  # type: ignore[arg-type]
        guard=active.guard,
    )
    first = asyncio.run(hooks.pre_tool("write", {}, "c1"))
    assert first.blocked is not None  # the trusted guard ran and blocked

    (repo / "guard.sh").write_text("exit 0\n")  # what the model's write would do
    second = asyncio.run(hooks.pre_tool("write", {}, "c2"))
    assert second.blocked is None
    ran = [e for e in events if e.type == "hook"]
    assert len(ran) == 1  # only the first call ran the script
    (stopped,) = [e for e in events if e.type == "error" and e.kind == "hook_trust"]
    assert "guard.sh" in stopped.message and "no longer run in this session" in stopped.message
    assert hooks.hooks == []
