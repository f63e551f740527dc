"""hooks.json: what loads, what is a problem, and that a problem costs only its own file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.core.hooks.active import active_hooks
from agent.core.hooks.config import (
    REPOSITORY_FILE,
    HookFile,
    HookProblem,
    digest,
    load_hooks,
    parse_hooks,
)
from agent.core.hooks.trust import HookTrust
from tests.agent.hooks.helpers import repository_hooks, user_hooks


def parse(data) -> HookFile | HookProblem:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return parse_hooks(raw, Path("/cfg/hooks.json"), "user")


def test_a_valid_file_gives_hooks_in_event_order_with_their_settings():
    data = {
        "hooks": {
            "stop": [{"command": "./done.sh"}],
            "pre_tool": [
                {"matcher": "shell|write", "command": "./check.sh", "timeout": 30},
                {"command": "echo all", "matcher": "*", "name": "every tool"},
            ],
        }
    }
    loaded = parse(data)
    assert isinstance(loaded, HookFile)
    assert [(h.event, h.index) for h in loaded.hooks] == [
        ("pre_tool", 0),
        ("pre_tool", 1),
        ("stop", 0),
    ]
    check, every, stop = loaded.hooks
    assert check.timeout == 30 and check.name == "./check.sh" and check.source == "user"
    assert check.matches("shell") and check.matches("write")
    assert not check.matches("shell_extra") and not check.matches("read")  # the whole name
    assert every.matcher is None and every.matches("anything") and every.name == "every tool"
    assert stop.timeout == 60
    assert loaded.digest == digest(json.dumps(data).encode())


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"{not json", "not valid JSON (line 1"),
        (b"[]", "must hold a JSON object, not list"),
        (b"\xff\xfe", "not UTF-8"),
        (
            {"hooks": {"pre_tol": [{"command": "x"}]}},
            "hooks.pre_tol: unknown event; the events are",
        ),
        ({"hooks": {"stop": [{"comand": "x"}]}}, "hooks.stop.0.comand: unknown field"),
        ({"hooks": {"stop": [{"command": "   "}]}}, "hooks.stop.0.command: must not be blank"),
        (
            {"hooks": {"pre_tool": [{"command": "x", "matcher": "("}]}},
            "not a valid regular expression",
        ),
        (
            {"hooks": {"stop": [{"command": "x", "matcher": "shell"}]}},
            "only pre_tool and post_tool",
        ),
        ({"hooks": {"stop": [{"command": "x", "timeout": 601}]}}, "hooks.stop.0.timeout"),
        ({"hooks": {"stop": {"command": "x"}}}, "hooks.stop: Input should be a valid list"),
        ({"hook": {}}, "hook: unknown field"),
    ],
)
def test_problems_name_the_file_and_the_field(data, expected):
    problem = parse(data)
    assert isinstance(problem, HookProblem)
    assert expected in problem.message
    assert problem.describe().startswith("/cfg/hooks.json: ")


def test_a_broken_file_costs_only_its_own_hooks(repo):
    user = user_hooks({"stop": [{"command": "x", "bogus": 1}]})
    repository_hooks(repo, {"user_prompt": [{"command": "echo hi"}]})
    config = load_hooks(repo)
    assert config.user is None
    assert [p.file for p in config.problems] == [user]
    assert config.repository is not None and len(config.repository.hooks) == 1


def test_no_files_is_empty_and_an_empty_file_has_no_hooks(repo):
    assert load_hooks(repo).empty
    (repo / REPOSITORY_FILE).parent.mkdir()
    (repo / REPOSITORY_FILE).write_text("")
    config = load_hooks(repo)
    assert not config.empty and config.repository is not None and config.repository.hooks == ()


def test_repository_hooks_run_only_trusted_with_a_sandbox(repo):
    user_hooks({"stop": [{"command": "echo mine"}]})
    repository_hooks(repo, {"stop": [{"command": "echo theirs"}]})
    trust = HookTrust()

    untrusted = active_hooks(load_hooks(repo), repo, sandboxed=True, trust=trust)
    assert [h.command for h in untrusted.hooks] == ["echo mine"]
    (notice,) = untrusted.notices
    assert notice.kind == "hook_trust" and "not trusted" in notice.message
    assert "resident hooks trust" in notice.message

    trust.trust(repo, load_hooks(repo).repository.digest)
    trusted = active_hooks(load_hooks(repo), repo, sandboxed=True, trust=trust)
    assert [h.command for h in trusted.hooks] == ["echo mine", "echo theirs"]
    assert trusted.notices == []

    no_sandbox = active_hooks(load_hooks(repo), repo, sandboxed=False, trust=trust)
    assert [h.command for h in no_sandbox.hooks] == ["echo mine"]
    assert "only inside the sandbox" in no_sandbox.notices[0].message

    repository_hooks(repo, {"stop": [{"command": "echo changed"}]})
    changed = active_hooks(load_hooks(repo), repo, sandboxed=True, trust=trust)
    assert [h.command for h in changed.hooks] == ["echo mine"]
    assert "changed since you trusted it" in changed.notices[0].message


def test_trust_is_per_path_and_content_and_an_unreadable_record_trusts_nothing(tmp_path):
    trust = HookTrust(tmp_path / "trusted.json")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    trust.trust(a, "d1")
    assert trust.state(a, "d1") == "trusted"
    assert trust.state(a, "d2") == "changed"
    assert trust.state(b, "d1") == "untrusted"
    (tmp_path / "link").symlink_to(a)
    assert trust.state(tmp_path / "link", "d1") == "trusted"  # keyed by the real path
    assert oct((tmp_path / "trusted.json").stat().st_mode & 0o777) == "0o600"
    assert trust.untrust(a) and not trust.untrust(a)
    trust.trust(a, "d1")
    (tmp_path / "trusted.json").write_text("{torn")
    assert trust.state(a, "d1") == "untrusted"
