"""Every attack of the hostile suite again, without a sandbox (`ToolContext(sandbox=None)`):
the policy must fail closed. Read-only mode offers no shell; in the other modes every
command asks, whatever the parser thinks of it, so with nobody there to approve nothing
runs and nothing changes.

Only "nobody" approves here: a command a person approves without a sandbox runs on the
host as it is, which is the user's decision and not something to try with these
commands. A shell command the policy wrongly let through is not run either: the harness
puts a guard in the shell tool's place that reports it (see `_NoHostShell`).
"""

from __future__ import annotations

import pytest

from tests.tools import (
    test_hostile_commands,
    test_hostile_config,
    test_hostile_git,
    test_hostile_processes,
    test_hostile_secrets,
    test_hostile_writes,
)
from tests.tools.hostile_harness import (
    FALLBACK_CONFIGS,
    Attack,
    Call,
    Config,
    run_attack,
)

EVERY_ATTACK = [
    *test_hostile_commands.ATTACKS,
    *test_hostile_git.ATTACKS,
    *test_hostile_git.PUSH_ATTACKS,
    *test_hostile_git.ALLOWED_MAKE,
    *test_hostile_secrets.ATTACKS,
    *test_hostile_processes.ATTACKS,
    *test_hostile_writes.ATTACKS,
    *test_hostile_config.ATTACKS,
]


def test_the_suite_is_large_enough():
    assert len({a.id for a in EVERY_ATTACK}) == len(EVERY_ATTACK) >= 40


def assert_failed_closed(calls: list[Call], config: Config) -> None:
    """No sandbox: read-only mode offers no shell; elsewhere every command asks (or a
    rule or a path outside denies it) and, with nobody there, nothing runs."""
    for call in calls:
        if call.tool != "shell":
            continue
        if config.mode == "read-only":
            assert not call.asked and call.output.startswith("Denied"), call.output
        else:
            assert call.asked or call.output.startswith("Denied"), call.output
        assert not call.ran, call.output


def run_unsandboxed(tmp_path, attack: Attack, config: Config) -> None:
    _, calls = run_attack(tmp_path, attack, config, sandbox=None)
    assert_failed_closed(calls, config)


@pytest.mark.parametrize("attack", EVERY_ATTACK, ids=lambda a: a.id)
def test_without_a_sandbox_every_command_fails_closed(tmp_path, attack):
    """Each mode in turn, with nobody to approve (one test per attack keeps it quick)."""
    for config in FALLBACK_CONFIGS:
        if str(config) not in attack.fallback_holes:
            run_unsandboxed(tmp_path / config.mode, attack, config)
