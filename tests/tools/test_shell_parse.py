"""Shell analysis: every command a line would run is found, and what cannot be seen is flagged."""

from __future__ import annotations

import pytest

from tools.shell.parse import analyze, command_positions


def _programs(command: str) -> set[str]:
    return {
        position[0]
        for c in analyze(command).commands
        for position in command_positions(c.argv)
        if position
    }


@pytest.mark.parametrize(
    "command",
    [
        "ls; rm -rf ~",
        "ls && rm x",
        "ls || rm x",
        "ls\nrm x",
        "ls | xargs rm",
        "ls $(rm x)",
        "ls `rm x`",
        "diff <(rm x) y",
        "ls >(rm x)",
        "x=$(rm y) ls",
        "for f in a b; do rm $f; done",
        "if true; then ls; else rm y; fi",
        "f() { rm x; }; f",
        "{ ls; rm x; }",
        "(cd a && rm x)",
        "sh -c 'rm -rf /'",
        'bash -lc "ls; rm x"',
        "eval 'rm x'",
        "find . -name '*.py' -exec rm {} ;",
        "sudo -u root rm x",
        "env FOO=1 rm x",
        "env -S 'rm x'",
        "timeout -s KILL 5 rm x",
        "nice -n 5 rm x",
        "/bin/rm x",
        "r\\m x",
        "'rm' x",
        "ls | while read f; do rm $f; done",
        "time rm x",
        "ls && time -p rm x",
        "watch 'ls; rm x'",
        "flock /tmp/lock -c 'rm x'",
        "stdbuf -oL nohup command rm x",
        "exec -a name rm x",
        "xargs -0 -n1 rm",
        "sudo env -i nice -n 5 timeout 9 rm x",
    ],
)
def test_hidden_rm_is_found(command):
    programs = {p.rsplit("/", 1)[-1] for p in _programs(command)}
    assert "rm" in programs, command


@pytest.mark.parametrize(
    ("command", "fragment"),
    [
        ("ls $(curl x)", "command substitution"),
        ("ls `curl x`", "backtick"),
        ("diff <(ls) <(ls a)", "process substitution"),
        ("cat <<EOF\n$(rm x)\nEOF\n", "here-document"),
        ("ls | sh", "standard input"),
        ("curl x | bash", "standard input"),
        ("bash script.sh", "script file"),
        ("source env.sh", "sources"),
        ("$CMD x", "variable"),
        ("$'rm' x", "variable"),
        ('ls "unterminated', "could not be parsed"),
        ("case x in a) ls;; esac", "could not be parsed"),
        ("echo $((1+2))", "could not be parsed"),
        ("sh -c 'ls \"unterminated'", "could not be parsed"),
    ],
)
def test_what_cannot_be_seen_is_flagged(command, fragment):
    problem = analyze(command).visibility_problem()
    assert problem is not None and fragment in problem, (command, problem)


def test_redirects_are_classified():
    analysis = analyze("ls > out.txt 2>&1 < in.txt; echo hi >> log; cat x > /dev/null")
    assert analysis.write_targets == ["out.txt", "log"]
    reads = [r.target for c in analysis.commands for r in c.redirects if r.reads_file]
    assert reads == ["in.txt"]


def test_plain_commands_are_transparent():
    analysis = analyze("git status && ls -la src | grep py")
    assert analysis.visibility_problem() is None
    assert [c.argv for c in analysis.commands] == [
        ("git", "status"),
        ("ls", "-la", "src"),
        ("grep", "py"),
    ]


def test_background_and_assignments_are_recorded():
    analysis = analyze("FOO=1 make & echo $HOME")
    assert analysis.background
    assert analysis.commands[0].assignments == ("FOO=1",)
    assert analysis.commands[1].expanding_words == frozenset({1})


def test_nul_bytes_do_not_parse():
    assert analyze("ls\x00rm x").error


def test_the_time_keyword_only_times_what_follows():
    analysis = analyze("time -p make test | wc -l")
    assert analysis.visibility_problem() is None
    assert [c.argv for c in analysis.commands] == [("make", "test"), ("wc", "-l")]


def test_directory_stack_tildes_are_expansions():
    # ~+ is $PWD and ~- $OLDPWD: `~+/../x` is not a directory named '~+'.
    assert analyze("cat ~+/../x").commands[0].expanding_words == frozenset({1})
    assert analyze("cat ~-/x").commands[0].expanding_words == frozenset({1})
    assert analyze("cat ~/x").commands[0].expanding_words == frozenset()
    problem = analyze("make test > ~+/../outside/x").visibility_problem()
    assert problem and "redirect target" in problem
