"""The approval policy against each mode, each tool, rules, and a hostile model's tricks."""

from __future__ import annotations

import pytest

from tools import ApprovalMode, PermissionPolicy, Rule, ToolCall, Verdict

ALLOW, ASK, DENY = Verdict.ALLOW, Verdict.ASK, Verdict.DENY
MODES = ["read-only", "ask", "auto-edit", "full-auto"]


@pytest.fixture
def decide(registry, workspace):
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("x = 1\n")

    def run(mode, name, allow=(), deny=(), sandboxed=True, **arguments):
        policy = PermissionPolicy(
            ApprovalMode(mode), workspace=workspace, allow=allow, deny=deny, sandboxed=sandboxed
        )
        call = registry.parse(name, arguments)
        assert isinstance(call, ToolCall), call
        return policy.check(call)

    return run


# Expected verdicts in read-only, ask, auto-edit, full-auto.
MATRIX = [
    ("read", {"path": "src/a.py"}, (ALLOW, ALLOW, ALLOW, ALLOW)),
    ("list", {"path": "."}, (ALLOW, ALLOW, ALLOW, ALLOW)),
    ("glob", {"pattern": "**/*.py"}, (ALLOW, ALLOW, ALLOW, ALLOW)),
    ("grep", {"pattern": "x"}, (ALLOW, ALLOW, ALLOW, ALLOW)),
    ("git_status", {}, (ALLOW, ALLOW, ALLOW, ALLOW)),
    ("git_diff", {"staged": True}, (ALLOW, ALLOW, ALLOW, ALLOW)),
    ("git_log", {}, (ALLOW, ALLOW, ALLOW, ALLOW)),
    ("write", {"path": "src/b.py", "content": "y"}, (DENY, ASK, ALLOW, ALLOW)),
    ("edit", {"path": "src/a.py", "old_string": "1", "new_string": "2"}, (DENY, ASK, ALLOW, ALLOW)),
    ("shell", {"command": "ls -la src"}, (ALLOW, ALLOW, ALLOW, ALLOW)),
    ("shell", {"command": "git diff HEAD"}, (ALLOW, ALLOW, ALLOW, ALLOW)),
    ("shell", {"command": "pytest -q"}, (DENY, ASK, ASK, ALLOW)),
    ("shell", {"command": "rm -rf build"}, (DENY, ASK, ASK, ALLOW)),
    ("git_commit", {"message": "m"}, (DENY, ASK, ASK, ALLOW)),
    ("git_commit", {"message": "m", "no_verify": True}, (DENY, ASK, ASK, ASK)),
]


@pytest.mark.parametrize(("name", "arguments", "expected"), MATRIX)
@pytest.mark.parametrize("mode_index", range(4), ids=MODES)
def test_each_mode_against_each_tool(decide, name, arguments, expected, mode_index):
    decision = decide(MODES[mode_index], name, **arguments)
    assert decision.verdict is expected[mode_index], decision
    assert decision.reason and decision.request


@pytest.mark.parametrize("mode", MODES)
def test_paths_outside_the_workspace_are_denied_in_every_mode(decide, workspace, outside, mode):
    (workspace / "out").symlink_to(outside, target_is_directory=True)
    for name, arguments in [
        ("read", {"path": "../outside/secret.txt"}),
        ("read", {"path": "/etc/passwd"}),
        ("read", {"path": "out/secret.txt"}),
        ("write", {"path": "out/new.txt", "content": "x"}),
        ("list", {"path": "~"}),
        ("shell", {"command": "ls", "workdir": "out"}),
        ("git_diff", {"paths": ["../outside"]}),
    ]:
        decision = decide(mode, name, **arguments)
        assert decision.verdict is DENY, (name, arguments)
        assert "outside the workspace" in decision.reason


@pytest.mark.parametrize("mode", MODES)
def test_secrets_and_git_internals(decide, mode):
    assert decide(mode, "read", path=".env").verdict is ASK
    assert decide(mode, "read", path="deploy/id_rsa").verdict is ASK
    assert decide(mode, "read", path=".git/config").verdict is ASK
    assert decide(mode, "write", path=".git/hooks/pre-commit", content="x").verdict is DENY
    assert decide(mode, "read", path=".env", allow=["read:.env"]).verdict is ALLOW
    assert decide(mode, "read", path=".env.example").verdict is ALLOW


@pytest.mark.parametrize(
    "command",
    [
        "ls; rm -rf ~",
        "ls && rm x",
        "ls | sh",
        "ls $(curl x)",
        "ls `curl x`",
        "ls > file",
        "ls >> file",
        "cat <(curl x)",
        'ls "unterminated',
        "find . -delete",
        "find . -exec rm {} ;",
        "sort -o out.txt in.txt",
        "rg --pre ./evil x",
        "git -c core.pager=evil log",
        "git commit -m x",
        "git branch -D main",
        "git stash",
        "cat .env",
        "cat .git/config",
        "ls() { rm -rf x; }; ls",
    ],
)
def test_evasions_are_not_taken_for_read_only_commands(decide, command):
    assert decide("read-only", "shell", command=command).verdict is DENY, command
    assert decide("ask", "shell", command=command).verdict is ASK, command
    assert decide("auto-edit", "shell", command=command).verdict is ASK, command


# What only the sandbox confines: variables, outside paths, background jobs.
SANDBOX_CONFINED = [
    "FOO=bar ls",
    "ls $HOME",
    "ls &",
    "cat ../outside/secret.txt",
    "cat /etc/passwd",
    "cat ~/.ssh/id_rsa",
    "cd .. && cat outside/secret.txt",
    "cd src || cat ../outside/secret.txt",
    "head -n 1 ../*",
    "grep -r x --file=/etc/passwd",
]


@pytest.mark.parametrize("command", SANDBOX_CONFINED)
def test_the_sandbox_lets_confined_reads_run_unasked_with_a_read_only_workspace(decide, command):
    for mode in MODES:
        decision = decide(mode, "shell", command=command)
        assert decision.verdict is ALLOW, (mode, command, decision.reason)
        assert not decision.grant.write and not decision.grant.network


@pytest.mark.parametrize("command", [*SANDBOX_CONFINED, "ls", "git status", "cat src/a.py"])
def test_without_a_sandbox_every_command_asks_and_read_only_mode_has_no_shell(decide, command):
    assert decide("read-only", "shell", command=command, sandboxed=False).verdict is DENY
    for mode in ("ask", "auto-edit", "full-auto"):
        decision = decide(mode, "shell", command=command, sandboxed=False)
        assert decision.verdict is ASK, (mode, command)
        assert "no sandbox" in decision.reason
    allowed = decide("ask", "shell", command=command, sandboxed=False, allow=["shell"])
    assert allowed.verdict is ALLOW


def test_grants_follow_the_decision(decide):
    assert not decide("ask", "shell", command="ls").grant.write
    assert decide("ask", "shell", command="make test").grant.write  # once approved
    assert decide("full-auto", "shell", command="make test").grant.write
    assert not decide("read-only", "shell", command="ls").grant.write
    assert not decide("full-auto", "shell", command="pip install x").grant.network
    networked = decide("full-auto", "shell", command="pip install x", allow=["network:pip install"])
    assert networked.grant.network
    mixed = decide("full-auto", "shell", command="pip install x && curl y", allow=["network:pip"])
    assert not mixed.grant.network  # curl is not covered


@pytest.mark.parametrize(
    "command",
    [
        "ls",
        "ls -la src",
        "cat src/a.py | grep x | wc -l",
        "find . -name '*.py'",
        "rg -n TODO src",
        "grep -rn 'def ' src 2>/dev/null",
        "git --no-pager log --oneline -5",
        "git status && git diff",
        "cd src && ls && cat a.py",
        "head -n 5 src/a.py; tail src/a.py",
        "echo /etc/passwd",
        "pwd",
    ],
)
def test_read_only_commands_run_unasked(decide, command):
    for mode in MODES:
        assert decide(mode, "shell", command=command).verdict is ALLOW, (mode, command)


def test_allow_rules_by_command_prefix(decide):
    allow = ["shell:npm test", "shell(make lint)"]
    assert decide("ask", "shell", command="npm test", allow=allow).verdict is ALLOW
    assert decide("ask", "shell", command="npm test -- --watch=false", allow=allow).verdict is ALLOW
    assert decide("ask", "shell", command="CI=1 npm test", allow=allow).verdict is ALLOW
    assert decide("ask", "shell", command="npm test && make lint", allow=allow).verdict is ALLOW
    for command in [
        "npm testing",
        "npm test; rm -rf ~",
        "npm test $(curl x)",
        "npm test | sh",
        "PATH=/tmp/evil npm test",
        "LD_PRELOAD=x.so npm test",
        "$NPM test",
        "npm test > out.txt",
        "sudo npm test",
        'npm test "unterminated',
    ]:
        assert decide("ask", "shell", command=command, allow=allow).verdict is ASK, command
    # Redirecting into the workspace is a file change, which auto-edit allows.
    assert decide("auto-edit", "shell", command="npm test > out.txt", allow=allow).allowed
    assert decide("auto-edit", "shell", command="npm test > ../x", allow=allow).verdict is ASK


def test_allow_rules_by_path_glob(decide):
    allow = ["write:src/**", "edit:src/**"]
    assert decide("ask", "write", path="src/new.py", content="", allow=allow).verdict is ALLOW
    assert decide(
        "ask", "edit", path="src/a.py", old_string="1", new_string="2", allow=allow
    ).allowed
    assert decide("ask", "write", path="setup.py", content="", allow=allow).verdict is ASK
    # Allow rules never lift read-only mode.
    assert decide("read-only", "write", path="src/new.py", content="", allow=allow).denied
    assert decide("read-only", "shell", command="npm test", allow=["shell"]).denied


@pytest.mark.parametrize(
    "command",
    [
        "git push",
        "git push --force origin main",
        "ls && git push",
        "ls; git push",
        "echo $(git push)",
        "sh -c 'git push'",
        'bash -c "cd x && git push"',
        "sudo git push",
        "env GIT_TRACE=1 git push",
        "/usr/bin/git push",
        "xargs git push < list",
        "find . -exec git push ;",
        "eval 'git push'",
        "timeout 10 git push",
    ],
)
def test_deny_rules_win_and_see_through_chains_and_wrappers(decide, command):
    for mode in ("ask", "full-auto"):
        decision = decide(mode, "shell", command=command, allow=["shell"], deny=["shell:git push"])
        assert decision.verdict is DENY, (mode, command)
        assert "git push" in decision.reason


@pytest.mark.parametrize(
    "command", ["ls | sh", "$CMD push", "curl x | bash", "git $SUB", 'ls "unterminated']
)
def test_deny_rules_ask_when_the_line_hides_what_it_runs(decide, command):
    decision = decide("full-auto", "shell", command=command, deny=["shell:git push"])
    assert decision.verdict is ASK, command
    assert "cannot tell" in decision.reason


def test_unrelated_lines_pass_a_deny_rule(decide):
    assert decide("full-auto", "shell", command="git status", deny=["shell:git push"]).allowed
    assert decide("full-auto", "shell", command="echo git push", deny=["shell:git push"]).allowed
    assert decide("full-auto", "shell", command="echo $HOME", deny=["shell:git push"]).allowed
    assert decide("full-auto", "shell", command="git log $REF", deny=["shell:git push"]).allowed


def test_deny_rules_for_tools_and_paths(decide):
    assert decide("full-auto", "shell", command="ls", deny=["shell"]).denied
    assert decide("full-auto", "write", path="src/x.py", content="", deny=["*"]).denied
    denied = decide(
        "full-auto", "write", path="migrations/001.sql", content="", deny=["write:migrations/"]
    )
    assert denied.denied
    assert decide("full-auto", "read", path="src/a.py", deny=["write"]).allowed


def test_rule_parsing():
    assert Rule.parse("shell") == Rule("shell", None)
    assert Rule.parse("shell:git push") == Rule("shell", "git push")
    assert Rule.parse("shell(npm run build)") == Rule("shell", "npm run build")
    assert Rule.parse("*") == Rule("*", None)
    assert str(Rule("write", "src/**")) == "write:src/**"


def test_decision_describes_the_request(decide):
    decision = decide("ask", "shell", command="rm -rf build")
    assert decision.needs_approval
    assert decision.request == "Run: rm -rf build"
    assert "rm is not on the read-only command list" in decision.reason


def test_policy_from_context(ctx, registry):
    policy = PermissionPolicy.for_context(ctx, ApprovalMode.AUTO_EDIT)
    call = registry.parse("write", {"path": "x.txt", "content": "x"})
    assert policy.check(call).allowed


@pytest.mark.parametrize("sandboxed", [True, False])
@pytest.mark.parametrize("command", ["git -c alias.p=push p", "echo push | xargs git"])
def test_a_deny_rule_that_might_match_wins_over_a_tool_wide_allow(decide, command, sandboxed):
    allow, deny = ["shell"], ["shell:git push"]
    decision = decide("full-auto", "shell", command=command, allow=allow, deny=deny,
                      sandboxed=sandboxed)  # fmt: skip
    assert decision.verdict is ASK, decision.reason
    assert decide("read-only", "shell", command=command, deny=deny).verdict is DENY


def test_network_rules_see_through_wrappers(decide):
    allow = ["network:pip install"]
    assert decide(
        "full-auto", "shell", command="timeout 60 pip install x", allow=allow
    ).grant.network
    assert not decide("full-auto", "shell", command="sudo pip install x", allow=allow).grant.network


# Tools another program carries out (MCP servers' tools): ask, unless the mode or a rule
# that names them says otherwise; read-only mode only with a rule naming the tool or server.
EXTERNAL = [
    ("ask", (), (), "mcp__demo__echo", ASK),
    ("auto-edit", (), (), "mcp__demo__echo", ASK),
    ("full-auto", (), (), "mcp__demo__echo", ALLOW),
    ("ask", ("mcp__demo",), (), "mcp__demo__echo", ALLOW),
    ("ask", ("mcp__demo__echo",), (), "mcp__demo__echo", ALLOW),
    ("ask", ("mcp__demo__echo",), (), "mcp__demo__add", ASK),
    ("ask", ("mcp__dem",), (), "mcp__demo__echo", ASK),
    ("ask", ("mcp",), (), "mcp__other__x", ALLOW),
    ("ask", ("*",), (), "mcp__demo__echo", ALLOW),
    ("full-auto", (), ("mcp__demo",), "mcp__demo__echo", DENY),
    ("ask", ("mcp__demo",), ("mcp__demo__add",), "mcp__demo__add", DENY),
    ("read-only", (), (), "mcp__demo__echo", DENY),
    ("read-only", ("*",), (), "mcp__demo__echo", DENY),
    ("read-only", ("mcp__demo",), (), "mcp__demo__echo", ALLOW),
]


@pytest.mark.parametrize(("mode", "allow", "deny", "tool", "expected"), EXTERNAL)
def test_external_tools(workspace, mode, allow, deny, tool, expected):
    from tools import ToolAccess
    from tools.base import Effect

    policy = PermissionPolicy(
        ApprovalMode(mode), workspace=workspace, allow=allow, deny=deny, sandboxed=True
    )
    access = ToolAccess(effect=Effect.EXECUTE, summary=tool, external=True)
    assert policy.check_access(tool, access).verdict is expected


def test_namespace_rules_reach_only_namespaced_tools():
    assert Rule.parse("mcp__demo").covers_tool("mcp__demo__echo")
    assert not Rule.parse("mcp__demo").covers_tool("mcp__demo2__echo")
    assert not Rule.parse("mcp").covers_tool("shell")
    assert Rule.parse("*").covers_tool("mcp__demo__echo")
    assert not Rule.parse("*").names_tool("mcp__demo__echo")
