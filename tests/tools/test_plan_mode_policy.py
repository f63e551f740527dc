"""Plan mode is judged exactly as read-only: every verdict, grant and reason the same.

Differential: every tool call the permission tests, the rule tests and the hostile
suite put to read-only mode is put to plan mode too, with the same rules, with and
without a sandbox, and the decisions must agree (the reasons may differ only in
the mode's name). A case added to those suites is covered here without a change.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.tools import test_hostile_fallback, test_permissions, test_rule_normalization
from tools import ApprovalMode, PermissionPolicy, ToolAccess, ToolCall, Verdict
from tools.base import Effect

READ_ONLY, PLAN = ApprovalMode.READ_ONLY, ApprovalMode.PLAN


def _parametrized(test) -> list:
    """The values a test of another module is parametrized with (one argument)."""
    (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]
    return list(mark.args[1])


class _Blank(dict):
    """Fills every `{placeholder}` of a hostile command template with a plain path."""

    def __missing__(self, key: str) -> str:
        return "/tmp/placeholder"


def _filled(template: str) -> str | None:
    try:
        return string.Formatter().vformat(template, (), _Blank())
    except (ValueError, IndexError):
        return None  # a template whose braces are shell syntax; other cases cover it


def _commands() -> list[str]:
    commands = [
        *_parametrized(test_permissions.test_evasions_are_not_taken_for_read_only_commands),
        *_parametrized(test_permissions.test_read_only_commands_run_unasked),
        *test_permissions.SANDBOX_CONFINED,
        *test_rule_normalization.DENY_EVASIONS,
        *test_rule_normalization.ALLOW_TRICKS,
    ]
    for attack in test_hostile_fallback.EVERY_ATTACK:
        for template in [attack.command or ""] + [
            step[1].get("command", "") for step in attack.steps if step[0] == "shell"
        ]:
            command = _filled(template) if template else None
            if command:
                commands.append(command)
    return sorted(set(commands))


@dataclass(frozen=True)
class Case:
    tool: str
    arguments: dict
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()


RULE_SETS = [
    ((), ()),
    (("shell",), ()),
    (("shell:make test", "network:pip install"), ()),
    ((), ("shell:git push",)),
    (("*",), ("write:src/**",)),
]


def _cases() -> Iterator[Case]:
    for name, arguments, _ in test_permissions.MATRIX:
        for allow, deny in RULE_SETS:
            yield Case(name, arguments, allow, deny)
    paths = ["src/a.py", ".env", "deploy/id_rsa", ".git/config", "../outside/secret.txt", "/etc"]
    for path in paths:
        yield Case("read", {"path": path})
        yield Case("read", {"path": path}, allow=(f"read:{path}",))
        yield Case("write", {"path": path, "content": "x"})
        yield Case("write", {"path": path, "content": "x"}, allow=("write",))
    for command in _commands():
        for allow, deny in RULE_SETS:
            yield Case("shell", {"command": command}, allow, deny)


CASES = list(_cases())


def _same_reasons(read_only: str, plan: str) -> bool:
    return plan == read_only.replace("read-only mode", "plan mode")


def test_plan_is_read_only_and_nothing_else_is():
    assert READ_ONLY.read_only and PLAN.read_only
    assert not any(mode.read_only for mode in ApprovalMode if mode not in (READ_ONLY, PLAN))
    assert PLAN.label == "Plan" and "plan" in PLAN.description.lower()


def test_the_corpus_is_large():
    assert len(CASES) > 1000


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandbox", "no-sandbox"])
def test_every_read_only_verdict_is_the_same_in_plan_mode(registry, workspace, sandboxed):
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("x = 1\n")
    verdicts: set[Verdict] = set()
    mismatches = []
    for case in CASES:
        call = registry.parse(case.tool, case.arguments)
        assert isinstance(call, ToolCall), (case, call)
        decisions = [
            PermissionPolicy(
                mode, workspace=workspace, allow=case.allow, deny=case.deny, sandboxed=sandboxed
            ).check(call)
            for mode in (READ_ONLY, PLAN)
        ]
        read_only, plan = decisions
        verdicts.add(plan.verdict)
        same = (
            read_only.verdict is plan.verdict
            and read_only.grant == plan.grant
            and read_only.request == plan.request
            and _same_reasons(read_only.reason, plan.reason)
        )
        if not same:
            mismatches.append((case, read_only, plan))
    assert not mismatches, mismatches[:5]
    # The corpus reaches every verdict, so agreement is not agreement on one answer.
    assert verdicts == {Verdict.ALLOW, Verdict.ASK, Verdict.DENY}


def test_plan_mode_names_itself_when_it_refuses(registry, workspace):
    policy = PermissionPolicy(PLAN, workspace=workspace, sandboxed=True)
    write = policy.check(registry.parse("write", {"path": "new.py", "content": "x"}))
    assert write.denied and write.reason == "plan mode does not allow changes"
    run = policy.check(registry.parse("shell", {"command": "pytest -q"}))
    assert run.denied and run.reason.startswith("plan mode only runs read-only commands")
    reading = policy.check(registry.parse("shell", {"command": "ls -la"}))
    assert reading.allowed and not reading.grant.write


@pytest.mark.parametrize(
    ("allow", "expected"),
    [((), Verdict.DENY), (("*",), Verdict.DENY), (("mcp__demo",), Verdict.ALLOW)],
)
def test_external_tools_run_in_plan_mode_only_when_a_rule_names_them(workspace, allow, expected):
    access = ToolAccess(effect=Effect.EXECUTE, summary="mcp__demo__echo", external=True)
    for mode in (READ_ONLY, PLAN):
        policy = PermissionPolicy(mode, workspace=workspace, allow=allow, sandboxed=True)
        assert policy.check_access("mcp__demo__echo", access).verdict is expected, mode
