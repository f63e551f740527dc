"""The MCP config files: shape, merging, clear errors, trust, variables, and how a server starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.core import process_guard
from agent.core.mcp.config import load_config, mcp_trust
from agent.core.mcp.launch import LaunchRefused, sandbox_label, stdio_parameters
from agent.core.mcp.trust import server_coverage
from tests.agent.mcp.helpers import write_config
from tools.sandbox.bubblewrap import Sandbox
from tools.sandbox.grants import SandboxSettings

ENV = {"GITHUB_TOKEN": "ghp_secret", "PLAIN": "plain", "HOME": "/home/u", "PATH": "/usr/bin"}


@pytest.fixture
def files(tmp_path):
    workspace = tmp_path / "repo"
    workspace.mkdir()
    return workspace, tmp_path / "user" / "mcp.json", workspace / ".resident" / "mcp.json"


def load(workspace: Path, user: Path):
    return load_config(workspace, user_file=user, lookup=ENV.get)


def test_user_and_repository_servers_merge_and_the_users_name_is_kept(files):
    workspace, user, repo = files
    write_config(user, {"a": {"command": "a-user"}, "b": {"url": "https://b.example/mcp"}})
    write_config(repo, {"a": {"command": "a-repo", "args": ["--x"]}, "c": {"command": "c"}})
    config = load(workspace, user)
    assert sorted(config.servers) == ["a", "b", "c"]
    a = config.servers["a"]
    assert (a.source, a.command, a.args, a.file) == ("user", "a-user", (), user)
    assert config.servers["c"].source == "repository"
    assert config.servers["b"].transport == "http"
    assert config.files == [user, repo]
    (problem,) = config.problems  # the repository's "a" is refused, loudly
    assert problem.file == repo and problem.server is None
    assert "mcpServers.a: not started" in problem.message
    assert "never replaces yours" in problem.message and "rename it" in problem.message


def test_no_files_no_servers(files):
    workspace, user, _ = files
    config = load(workspace, user)
    assert config.servers == {} and config.problems == [] and config.files == []


def test_a_broken_file_is_named_with_the_place_and_the_other_file_still_loads(files):
    workspace, user, repo = files
    user.parent.mkdir(parents=True)
    user.write_text('{"mcpServers": {"a": {"command": "x",}}}')
    write_config(repo, {"c": {"command": "c"}})
    config = load(workspace, user)
    (problem,) = config.problems
    assert problem.file == user and problem.server is None
    assert "not valid JSON (line 1, column" in problem.describe()
    assert str(user) in problem.describe()
    assert list(config.servers) == ["c"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"comand": "x"}, "mcpServers.bad.comand: unknown field"),
        ({"command": "x", "url": "http://h/mcp"}, 'give "command" (stdio) or "url"'),
        ({"args": ["x"]}, 'needs "command" (a stdio server) or "url"'),
        ({"command": "x", "args": "--flag"}, "mcpServers.bad.args: Input should be a valid list"),
        ({"url": "ftp://h/mcp"}, '"url" must start with http:// or https://'),
        ({"command": "x", "toolTimeout": 0}, "mcpServers.bad.toolTimeout: Input should be greater"),
        ("npx server", "mcpServers.bad: must be an object"),
    ],
)
def test_a_broken_entry_names_file_and_field_and_costs_only_that_server(files, entry, message):
    workspace, user, _ = files
    write_config(user, {"bad": entry, "good": {"command": "good"}})
    config = load(workspace, user)
    (problem,) = config.problems
    assert problem.server == "bad" and problem.file == user
    assert message in problem.describe(), problem.describe()
    assert list(config.servers) == ["good"]


def test_a_broken_repository_entry_costs_that_entry(files):
    workspace, user, repo = files
    write_config(user, {"a": {"command": "a"}})
    write_config(repo, {"b": {"command": 3}})
    config = load(workspace, user)
    assert list(config.servers) == ["a"] and config.problems[0].server == "b"


def test_disabled_entries_are_left_out_but_a_repository_cannot_disable_yours(files):
    workspace, user, repo = files
    write_config(user, {"a": {"command": "a"}, "b": {"command": "b", "disabled": True}})
    write_config(repo, {"a": {"command": "a", "disabled": True}, "c": {"disabled": True}})
    config = load(workspace, user)
    assert list(config.servers) == ["a"] and config.servers["a"].source == "user"


def test_the_users_entries_expand_variables_withheld_ones_too(files, monkeypatch):
    workspace, user, _ = files
    write_config(
        user,
        {
            "gh": {
                "command": "gh-mcp",
                "env": {"TOKEN": "${GITHUB_TOKEN}", "MODE": "${UNSET:-fast}"},
                "args": ["${PLAIN}", "${UNSET}"],
            },
            "web": {"url": "https://h/mcp", "headers": {"Authorization": "Bearer ${API_TOKEN}"}},
        },
    )
    monkeypatch.delenv("PLAIN", raising=False)
    monkeypatch.setitem(process_guard._withheld, "API_TOKEN", "t0ken")
    monkeypatch.delenv("API_TOKEN", raising=False)
    config = load_config(workspace, user_file=user, lookup=None)
    gh = config.servers["gh"]
    assert gh.env["MODE"] == "fast" and gh.args == ("", "")  # PLAIN is not set here
    assert config.servers["web"].headers == {"Authorization": "Bearer t0ken"}
    config = load(workspace, user)
    assert config.servers["gh"].env["TOKEN"] == "ghp_secret"
    assert config.servers["gh"].args == ("plain", "")


def test_a_repositorys_entries_get_no_grants_and_no_variables_unless_trusted(files):
    workspace, user, repo = files
    entry = {
        "command": "srv",
        "env": {"TOKEN": "${GITHUB_TOKEN}"},
        "network": True,
        "write": True,
        "read": ["/opt/data"],
    }
    write_config(repo, {"untrusted": entry, "trusted": entry})
    write_config(user, {})
    mcp_trust().trust(workspace, {"trusted": server_coverage("trusted", entry, workspace)})
    config = load(workspace, user)
    untrusted, trusted = config.servers["untrusted"], config.servers["trusted"]
    assert untrusted.env["TOKEN"] == "${GITHUB_TOKEN}"
    assert (untrusted.network, untrusted.write, untrusted.read) == (False, False, ())
    assert not untrusted.trusted
    assert "network, write, read not granted" in untrusted.notes[0]
    assert trusted.env["TOKEN"] == "ghp_secret"
    assert (trusted.network, trusted.write, trusted.read) == (True, True, (Path("/opt/data"),))
    assert trusted.trusted and not trusted.notes


def test_without_a_sandbox_only_trusted_servers_start(files):
    workspace, user, repo = files
    write_config(repo, {"repo": {"command": "srv"}})
    write_config(user, {"mine": {"command": "mine", "env": {"MINE": "1"}}})
    config = load(workspace, user)
    with pytest.raises(LaunchRefused, match="no sandbox to confine a server this repository"):
        stdio_parameters(config.servers["repo"], workspace, None, SandboxSettings(), ENV)
    params = stdio_parameters(config.servers["mine"], workspace, None, SandboxSettings(), ENV)
    assert params.command == "mine" and params.cwd == workspace
    assert params.env["MINE"] == "1" and params.env["PATH"] == "/usr/bin"
    assert "GITHUB_TOKEN" not in params.env and "PLAIN" not in params.env  # the allow-list
    assert sandbox_label(config.servers["mine"], None) == "none (no sandbox on this machine)"


def test_in_the_sandbox_a_server_gets_its_grants_only(files):
    workspace, user, _ = files
    write_config(user, {"off": {"command": "srv"}, "on": {"command": "srv", "network": True}})
    config = load(workspace, user)
    sandbox = Sandbox("/usr/bin/bwrap", "system", "0.11.0", disable_userns=True)
    off = stdio_parameters(config.servers["off"], workspace, sandbox, SandboxSettings(), ENV)
    on = stdio_parameters(config.servers["on"], workspace, sandbox, SandboxSettings(), ENV)
    assert off.command == "/usr/bin/bwrap" and off.args[-2:] == ["--", "srv"]
    assert "--unshare-all" in off.args and "--share-net" not in off.args
    assert "--share-net" in on.args
    assert ["--ro-bind", str(workspace), str(workspace)] == off.args[
        off.args.index(str(workspace)) - 1 : off.args.index(str(workspace)) + 2
    ]
    assert off.env["HOME"] == "/home/u" and off.env["TMPDIR"] == "/tmp"
    assert sandbox_label(config.servers["on"], sandbox) == (
        "bubblewrap: workspace read-only, network on"
    )
