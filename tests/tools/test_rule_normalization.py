"""Rules match what a command really runs: wrappers and git's global options taken off,
and a command the matcher cannot follow asks (issue 14, item 6)."""

from __future__ import annotations

import shlex

import pytest

from tools import ApprovalMode, PermissionPolicy, ToolCall, Verdict
from tools.shell.normalize import Layer, allow_covers, deny_hits, reduce_command
from tools.shell.option_words import names_long_option, resolve_long, short_letters
from tools.shell.readonly import path_operands, read_only_problem

ALLOW, ASK, DENY = Verdict.ALLOW, Verdict.ASK, Verdict.DENY


@pytest.fixture
def decide(registry, workspace):
    (workspace / "src").mkdir()

    def run(mode, command, allow=(), deny=()):
        policy = PermissionPolicy(
            ApprovalMode(mode), workspace=workspace, allow=allow, deny=deny, sandboxed=True
        )
        call = registry.parse("shell", {"command": command})
        assert isinstance(call, ToolCall), call
        return policy.check(call)

    return run


# Each runs `git push`, or may: a deny rule `shell:git push` must deny it or ask.
DENY_EVASIONS = [
    "git --no-pager push",
    "git -c color.ui=never push",
    "git -C dir push",
    "git --git-dir=x push",
    "git --git-dir x --work-tree y push",
    "git -P --literal-pathspecs --no-optional-locks push",
    "git --bare --namespace=n push",
    "/usr/bin/git push",
    "git-push origin",
    "/usr/lib/git-core/git-push",
    "env GIT_X=1 git push",
    "env -i -u HOME -C /tmp FOO=1 git push",
    "env -S 'git push'",
    "env 'BASH_FUNC_x%%=() { :; }' bash -c 'git push'",
    "command git push",
    "command -p git push",
    "builtin command git push",
    "exec git push",
    "exec -a name git push",
    "nice -n 5 git push",
    "nice -5 git push",
    "ionice -c 3 git push",
    "timeout 5 git push",
    "timeout -s KILL --kill-after=3 5 git push",
    "timeout --fore 5 git push",  # an abbreviation of --foreground
    "stdbuf -oL git push",
    "nohup git push",
    "time git push",
    "time -p git push",
    "ls && time git push",
    "xargs git push",
    "xargs -0 -n1 git push",
    "xargs git",  # the subcommand comes from the input
    "echo push | xargs git",
    "xargs -I{} git {}",
    "sudo git push",
    "sudo -u root -E git push",
    "sudo --us root git push",  # an abbreviation of --user
    "sudo VAR=1 git push",
    "sudo --weird git push",
    "doas -u x git push",
    "setsid -f git push",
    "chrt 5 git push",
    "taskset -c 0 git push",
    "flock /tmp/l git push",
    "flock /tmp/l -c 'git push'",
    "watch -n 1 git push",
    "watch 'ls; git push'",
    "strace -f -o /tmp/x git push",
    "unbuffer git push",
    "sudo env nice timeout 5 git --no-pager push",
    "find . -exec git push ;",
    "find push -exec git {} ;",
    "gi? push",
    "git pus? origin",
    "{git,push}",
    "git -c alias.p=push p",
    "git --config-env=alias.p=X p",
    "git -c core.fsmonitor=x status",
    "git --exec-path=/tmp push",
    "nice -n $N git push",
    "git $OPT push",
    "$GIT push",
    "env $X git push",
]


@pytest.mark.parametrize("command", DENY_EVASIONS)
def test_deny_rules_see_through_wrappers_and_git_options(decide, command):
    for mode in ("ask", "full-auto"):
        decision = decide(mode, command, allow=["shell"], deny=["shell:git push"])
        assert decision.verdict in (DENY, ASK), (mode, command, decision.reason)
        assert "git push" in decision.reason, decision.reason


@pytest.mark.parametrize(
    "command",
    [
        "git --no-pager push",
        "git -c color.ui=never push",
        "/usr/bin/git push",
        "env GIT_X=1 git push",
        "command git push",
        "nice -n 5 git push",
        "timeout 5 git push",
        "xargs git push",
        "stdbuf -oL git push",
        "nohup git push",
        "exec git push",
        "time git push",
        "sudo git push",
        "doas git push",
        "builtin command git push",
        "git-push origin",
    ],
)
def test_what_the_matcher_can_follow_is_denied_outright(decide, command):
    decision = decide("full-auto", command, allow=["shell"], deny=["shell:git push"])
    assert decision.verdict is DENY, (command, decision.reason)


@pytest.mark.parametrize(
    "command",
    [
        "git status",
        "git --no-pager log -5",
        "git -c color.ui=never log",
        "nice -n 5 git log",
        "command -v git",  # says where git is; runs nothing
        "git --version",
        "echo git push",
        "timeout 5 make test",
    ],
)
def test_deny_rules_leave_other_commands_alone(decide, command):
    decision = decide("full-auto", command, deny=["shell:git push"])
    assert decision.verdict is ALLOW, (command, decision.reason)


def test_a_deny_rule_written_with_a_wrapper_also_denies_the_bare_command(decide):
    assert decide("full-auto", "git push", deny=["shell:sudo git push"]).denied
    assert decide("full-auto", "sudo ls", deny=["shell:sudo"]).denied


# An allow rule `shell:make test` must not cover any of these.
ALLOW_TRICKS = [
    "make test; rm -rf x",
    "make test && rm -rf x",
    "make test | sh",
    "make test & rm x",
    "make test > ~+/../outside/x",
    "make test > ~-/x",
    "make test > ../outside/x",
    "sudo make test",
    "doas make test",
    "xargs make test",
    "./make test",
    "/tmp/evil/make test",
    "./nice make test",
    "/usr/bin/timeout 5 make test",
    "env PATH=/tmp make test",
    "env LD_PRELOAD=x.so make test",
    "env -S 'PATH=/x make' test",
    "env 'BASH_FUNC_make%%=() { rm -rf x; }' make test",
    "env -C /tmp make test",
    "PYTHONPATH=x make test",
    "MAKEFLAGS=--eval=x make test",
    "time -o /tmp/x make test",
    "setsid make test",
    "flock x make test",
    "make te?t",
    "{make,rm} test",
    "make $T",
    "$MAKE test",
    "nice -n $N make test",
    "env $X make test",
]


@pytest.mark.parametrize("command", ALLOW_TRICKS)
def test_allow_rules_are_not_tricked(decide, command):
    for mode in ("ask", "auto-edit"):
        decision = decide(mode, command, allow=["shell:make test"])
        assert decision.verdict is ASK, (mode, command, decision.reason)


@pytest.mark.parametrize(
    "command",
    [
        "make test",
        "make test -j4",
        "FOO=1 make test",
        # A harmless variable set through env is allowed like one set by the shell;
        # the variables in DANGEROUS_ASSIGNMENT ask either way (see ALLOW_TRICKS).
        "env FOO=1 make test",
        "env -i make test",
        "nice -n 5 make test",
        "timeout 60 make test",
        "timeout --signal=KILL 60 make test",
        "time make test",
        "command make test",
        "exec make test",
        "stdbuf -oL make test",
        "ionice -c 3 nohup make test",
        "make test && git status",
    ],
)
def test_allow_rules_cover_harmless_wrappers(decide, command):
    decision = decide("ask", command, allow=["shell:make test"])
    assert decision.verdict is ALLOW, (command, decision.reason)


def test_allow_rules_written_with_a_wrapper_still_match_as_written(decide):
    assert decide("ask", "sudo apt-get update", allow=["shell:sudo apt-get update"]).allowed
    assert decide("ask", "apt-get update", allow=["shell:sudo apt-get update"]).needs_approval
    assert decide("ask", "sudo -u x ls", allow=["shell:sudo"]).allowed
    # What the matcher cannot follow hides commands the rules never saw.
    hidden = decide("ask", "sudo --odd sh -c 'rm -rf x'", allow=["shell:sudo"])
    assert hidden.needs_approval, hidden.reason
    assert decide("ask", "git -c core.pager=x log", allow=["shell:git"]).needs_approval


def test_git_global_options_are_transparent_only_when_harmless(decide):
    allow = ["shell:git commit"]
    assert decide("ask", "git --no-pager commit -m x", allow=allow).allowed
    for command in ["git -c core.hooksPath=x commit", "git -C ../other commit", "/x/git commit"]:
        assert decide("ask", command, allow=allow).needs_approval, command


# -- the reduction itself ------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "final"),
    [
        ("sudo -u root env FOO=1 nice -n 5 /usr/bin/git --no-pager push", "/usr/bin/git push"),
        ("timeout -k 3 5 stdbuf -oL -eL git log", "git log"),
        ("env -S 'FOO=1 git' push", "git push"),
        ("flock /tmp/l -c 'git push'", "sh -c 'git push'"),
        ("watch -n1 'ls; git push'", "sh -c 'ls; git push'"),
        ("watch -x git push", "git push"),
        ("xargs", "echo"),
        ("git-push origin", "git push origin"),
        ("git --help push", "git help push"),
        ("nice -n5 -- git push", "git push"),
    ],
)
def test_reduce_command_finds_what_finally_runs(command, final):
    reduction = reduce_command(shlex.split(command))
    assert reduction.problem is None, reduction.problem
    assert shlex.join(reduction.final.argv) == final


@pytest.mark.parametrize(
    "command",
    ["sudo -s", "ionice -p 1 git push", "git -c alias.x=push x", "nice --bogus git push"],
)
def test_reduce_command_says_when_it_cannot_follow(command):
    assert reduce_command(shlex.split(command)).problem


def test_reduction_notes_what_an_allow_rule_must_not_hide():
    assert reduce_command(["env", "FOO=1", "nice", "make"]).transparent
    assert reduce_command(["env", "FOO=1", "make"]).assignments == ("FOO=1",)
    assert not reduce_command(["sudo", "make"]).transparent
    assert not reduce_command(["git", "-C", "x", "log"]).transparent
    assert reduce_command(["git", "--no-pager", "log"]).transparent
    assert reduce_command(["command", "-v", "git"]).final.argv == ("command", "-v", "git")


def test_matching_helpers():
    written = Layer.of(("xargs", "git"))
    assert deny_hits(written, [("git", "push")]) is None  # xargs adds the subcommand
    assert deny_hits(Layer.of(("git", "log")), [("git", "push")]) is False
    assert deny_hits(Layer.of(("git", "$X"), frozenset({1})), [("git", "push")]) is None
    make = Layer.of(("nice", "make", "test"))
    assert allow_covers(make, reduce_command(make.argv), ("make", "test"))
    sudo = Layer.of(("sudo", "make", "test"))
    assert not allow_covers(sudo, reduce_command(sudo.argv), ("make", "test"))


# -- read-only classification ----------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "sort --outp=src/a.py x",
        "sort --compress-prog=sh x",
        "sort --files0-from=-",
        "sort -T /tmp x",
        "sort -nro out x",
        "git grep --open-files-in-pag=vim x",
        "git grep -Ovim x",
        "git grep -nO x",
        "date -s now",
        "date --se=now",
        "date 0101",
        "printf -v x %b 'a[\\x24(id)]'",
        "test -v 'b[x]'",
        "[ -v 'a[$(id)]' ]",
        "git remote show origin",
        "git remote update",
        "git fetch",
        "git ls-remote",
        "git branch --set-upstream-to=origin/main",
        "git branch -u origin/main",
        "git branch --unset-upstream",
        "git branch --edit-description",
        "git branch newname",
        "git config user.name",
        "git config --get user.name",
        "git tag -v v1",
        "git tag --verify v1",
        "git log --show-signature",
        "git log --show-sig",
        "git log --format=%G?",
        "git -c x=y log",
        "git --exec-path=/x log",
        "git diff --ext-diff",
        "git diff --textconv",
        "git difftool",
        "git log --outp=x",
        "git show --output=x",
        "git cat-file --filters HEAD:x",
        "git stash pop",
        "git submodule status",
        "find . -fprint x",
        "find . -files0-from x",
        "rg --pre=sh x",
        "rg --search-zip x",
        "rg -nz x",
        "rg --hostname-bin=sh x",
        "tree -o x",
        "tree -R",
        "uniq -f1 a b",
        "hostname newname",
        "hostname -F file",
        "file -C",
        "file --comp",
        "md5sum -c sums",
        "wc --files0-from=x",
        "du --files0-f=x",
    ],
)
def test_writers_and_program_runners_are_not_read_only(command):
    assert read_only_problem(tuple(shlex.split(command))), command


@pytest.mark.parametrize(
    "command",
    [
        "sort -k1,2 -t: x",
        "sort --check x",
        "git grep -e O x",
        "date +%F",
        "date -Iseconds",
        "date -d yesterday +%F",
        "test -v x",
        "[ -f x ]",
        "git status",
        "git -P log",
        "git --no-pager log --oneline",
        "git remote -v",
        "git remote get-url origin",
        "git branch -a -v",
        "git branch --list 'feat*'",
        "git branch --contains HEAD",
        "git tag -l 'v*'",
        "git tag -n5",
        "git diff --text",
        "git log --output-indicator-new=x",
        "git rev-list --filter=blob:none HEAD",
        "git stash show -p",
        "git reflog HEAD",
        "rg --pre-glob=x y",
        "rg -e z x",
        "tree -L 2",
        "uniq -f 1 a",
        "hostname -f",
        "realpath src",
    ],
)
def test_inspecting_commands_stay_read_only(command):
    assert read_only_problem(tuple(shlex.split(command))) is None, command


def test_files_read_through_options_are_path_operands():
    assert path_operands(("date", "-f", "/etc/x")) == ["/etc/x"]
    assert path_operands(("date", "--reference=/etc/x", "+%F")) == ["/etc/x"]
    assert path_operands(("strings", "@/etc/x")) == ["/etc/x"]
    assert path_operands(("realpath", "../x")) == ["../x"]


def test_option_words():
    assert names_long_option("--outp=x", "--output")
    assert names_long_option("--o", "--output")
    assert not names_long_option("--output-indicator-new", "--output")
    assert not names_long_option("--text", "--textconv", exact=("--text",))
    assert resolve_long("--us", ("--user", "--group")) == "--user"
    assert resolve_long("--s", ("--shell", "--stdin")) is None
    assert short_letters("-nro") == "nro"
    assert short_letters("-k1o", valued="k") == "k"
