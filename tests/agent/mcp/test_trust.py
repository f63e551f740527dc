"""A repository's MCP servers start only once trusted, per repository and by content, and never
take a name of the user's."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.core.mcp.config import LEGACY_TRUST, load_config, mcp_trust
from agent.core.mcp.launch import trust_refusal
from agent.core.mcp.manager import McpManager
from agent.core.mcp.status import State
from tests.agent.mcp.helpers import BUILTIN, write_config

SERVER = {"command": "python", "args": ["tools/server.py", "--fast"]}


@pytest.fixture
def repo(tmp_path) -> Path:
    path = Path(os.path.realpath(tmp_path / "repo"))
    (path / "tools").mkdir(parents=True)
    (path / "tools" / "server.py").write_text("print('serving')\n")
    write_config(path / ".resident" / "mcp.json", {"lint": SERVER})
    return path


def load(workspace: Path, user: Path | None = None):
    user = user or workspace.parent / "no-user-mcp.json"
    return load_config(workspace, user_file=user, lookup=lambda _: None)


def trust(workspace: Path, *names: str) -> None:
    result = CliRunner().invoke(app, ["mcp", "trust", *names, "-w", str(workspace)])
    assert result.exit_code == 0, result.output


def test_an_untrusted_repository_server_does_not_start_and_says_how_to_trust_it(repo):
    config = load(repo)
    lint = config.servers["lint"]
    assert lint.trust_state == "untrusted" and not lint.trusted
    manager = McpManager(config, repo, None, reserved=BUILTIN)
    try:
        manager.start()
        assert manager.wait_settled(10)
        (status,) = manager.statuses()
    finally:
        manager.stop()
    assert status.state is State.FAILED
    assert "resident mcp trust lint" in status.reason and "not started" in status.reason


def test_trust_covers_the_entry_and_the_file_it_names(repo):
    trust(repo, "lint")
    assert load(repo).servers["lint"].trust_state == "trusted"
    assert trust_refusal(load(repo).servers["lint"], repo) is None

    (repo / "tools" / "server.py").write_text("import os; os.system('sh payload.sh')\n")
    lint = load(repo).servers["lint"]
    assert lint.trust_state == "changed" and lint.changed == ("tools/server.py",)
    refusal = trust_refusal(lint, repo)
    assert refusal is not None and "tools/server.py changed since you trusted it" in refusal

    trust(repo)  # read again, trusted again (every server of the file)
    write_config(repo / ".resident" / "mcp.json", {"lint": {**SERVER, "network": True}})
    assert load(repo).servers["lint"].trust_state == "changed"  # the entry itself


def test_a_file_rewritten_after_the_config_was_read_does_not_start(repo):
    trust(repo, "lint")
    lint = load(repo).servers["lint"]
    (repo / "tools" / "server.py").write_text("rewritten while the session opened\n")
    refusal = trust_refusal(lint, repo)
    assert refusal is not None and "tools/server.py" in refusal


def test_trust_is_per_repository_real_path(repo, tmp_path):
    trust(repo, "lint")
    clone = tmp_path / "clone"
    shutil.copytree(repo, clone)
    assert load(clone).servers["lint"].trust_state == "untrusted"
    link = tmp_path / "link"
    link.symlink_to(repo)
    assert load(link).servers["lint"].trust_state == "trusted"  # the same repository


def test_untrust_takes_it_back(repo):
    trust(repo, "lint")
    result = CliRunner().invoke(app, ["mcp", "untrust", "lint", "-w", str(repo)])
    assert result.exit_code == 0 and "no longer trusted" in result.output
    assert load(repo).servers["lint"].trust_state == "untrusted"
    assert mcp_trust().untrust(repo) == []


def test_trusting_an_unknown_server_is_a_clear_error(repo):
    result = CliRunner().invoke(app, ["mcp", "trust", "nope", "-w", str(repo)])
    assert result.exit_code == 1
    assert 'declares no server named "nope"' in result.output and '"lint"' in result.output


def test_a_repository_server_never_takes_the_users_name(repo, tmp_path):
    user = write_config(tmp_path / "user.json", {"lint": {"command": "my-lint"}})
    trust(repo, "lint")  # trusted or not, the name is the user's
    config = load(repo, user)
    assert config.servers["lint"].source == "user" and config.servers["lint"].command == "my-lint"
    (problem,) = config.problems
    assert problem.file == repo / ".resident" / "mcp.json" and problem.server is None
    assert "never replaces yours" in problem.message


def test_trusting_a_name_everywhere_is_no_longer_honoured(repo, tmp_path):
    user = write_config(tmp_path / "user.json", {}, trustedRepositoryServers=["lint"])
    config = load(repo, user)
    assert config.servers["lint"].trust_state == "untrusted"
    assert [p.message for p in config.problems] == [LEGACY_TRUST]


def test_trust_records_are_written_where_the_user_config_lives(repo):
    trust(repo, "lint")
    records = json.loads((Path(os.environ["RESIDENT_CONFIG_DIR"]) / "trusted-mcp.json").read_text())
    entry = records["repositories"][str(repo)]["servers"]["lint"]
    assert entry["files"] == {"tools/server.py": entry["files"]["tools/server.py"]}
