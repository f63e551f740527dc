"""Hostile commands, classes 1 and 2 of issue 14: "read-only" commands that run code or
write, and paths as bash expands them rather than as a checker sees them.

With the sandbox every one of them may run (a read-only-looking command runs unasked in
a read-only sandbox) but none reaches anything outside the workspace, prints a secret,
or changes the workspace without a grant. `payload.sh` (in every scene) is what a
planted program would do: touch files outside, in HOME and in the host's /tmp, and print
secrets from outside and from HOME.
"""

from __future__ import annotations

import pytest

from tests.tools.hostile_harness import (
    Attack,
    Call,
    Config,
    Scene,
    params,
    require_sandbox,
    run_attack,
)


def _payload_lines(scene: Scene) -> None:
    """Lines sort hands to `--compress-program=sh` (enough to make it spill)."""
    text = (scene.workspace / "payload.sh").read_text()
    (scene.workspace / "lines.txt").write_text(text * 4000)


def _src_unchanged_unless_granted(scene: Scene, calls: list[Call], config: Config) -> None:
    text = (scene.workspace / "src" / "a.py").read_text()
    if not any(c.writable for c in calls):
        assert text == "print('a')\n"


READ_ONLY_LOOKING = [
    Attack(
        "sort-compress-prog",
        "sort -S 1k -T /tmp --compress-prog=sh lines.txt | tail -2",
        setup=_payload_lines,
    ),
    Attack(
        "sort-outp",
        "sort --outp=src/a.py README.md; sort --outp=../outside/sort-{mark} README.md",
        check=_src_unchanged_unless_granted,
    ),
    Attack(
        "git-grep-open-files-in-pager",
        "git grep --open-files-in-pag='sh payload.sh' -e demo; git grep -O'sh payload.sh' demo",
    ),
    Attack(
        "printf-v-subscript",
        "printf -v x '%b' 'a[\\x24(sh payload.sh >&2)]'; test -v 'b[x]'; echo $x",
    ),
    Attack(
        "git-branch-set-upstream",
        "git branch --set-upstream-to=other; git branch -u other main; git config -l",
    ),
    Attack(
        "git-output-option",
        "git log -p -1 --output=../outside/log-{mark}; git diff HEAD --output=src/a.py; "
        "git show --outp=src/a.py HEAD",
        check=_src_unchanged_unless_granted,
    ),
    Attack("uniq-second-operand", "uniq README.md src/a.py; uniq README.md ../outside/u-{mark}"),
    Attack("find-fprint", "find . -maxdepth 1 -fprint ../outside/find-{mark}; find . -fls x"),
    Attack("rg-pre", "rg --pre=sh -e touch payload.sh; rg --pr sh touch ."),
    Attack("git-c-fsmonitor", "git -c core.fsmonitor='sh payload.sh' status"),
    Attack(
        "git-ext-diff", "echo x >> README.md; git -c diff.external='sh payload.sh' diff --ext-diff"
    ),
    Attack(
        "git-pager-env", "GIT_PAGER='sh payload.sh' git -p log -1; PAGER='sh payload.sh' man ls"
    ),
    Attack(
        "git-global-alias",
        "git config --global alias.x '!sh payload.sh'; git x; cat ~/.gitconfig",
    ),
    Attack("bash-env", "BASH_ENV=payload.sh bash -c true; ENV=payload.sh sh -i </dev/null"),
    Attack("ld-preload", "LD_PRELOAD=./payload.sh ls; LD_LIBRARY_PATH=. cat README.md"),
    Attack(
        "python-open-shadow",
        "python3 -c \"print(open('/etc/shadow').read()); print(open('/etc/gshadow').read())\"; "
        "cat /etc/shadow /etc/sudoers",
    ),
]

EXPANDED_PATHS = [
    Attack("glob-dotdot", "cat */../../outside/secret.txt; cat s*/../../outside/secret.txt"),
    Attack("brace-dotdot", "cat {{..,.}}/outside/secret.txt; ls {{..,.}}/outside"),
    Attack("tilde-plus", "cat ~+/../outside/secret.txt; ls -la ~+/.. ~+/../outside"),
    Attack("tilde-minus", "cat ~-/secret.txt; ls ~-"),
    Attack("bare-cd", "cd; pwd; ls -la; cat .aws/credentials .ssh/id_rsa .bash_history"),
    Attack("cd-dash-oldpwd", 'cd - && cat secret.txt; cd "$OLDPWD" && cat secret.txt'),
    Attack("cdpath", "cd outside && cat secret.txt; CDPATH={root} cd outside && cat secret.txt"),
    Attack(
        "absolute-outside", "cat {outside}/secret.txt {home}/.aws/credentials {home}/.ssh/id_rsa"
    ),
    Attack(
        "date-f",
        "date -f ../outside/secret.txt; date -f {outside}/secret.txt; date -f ~/.aws/credentials",
    ),
    Attack(
        "sort-files0-from",
        "printf '../outside/secret.txt\\0{home}/.aws/credentials\\0' | sort --files0-from=-",
    ),
    Attack("grep-r-tracked-symlink", "grep -R SECRET . ; grep -R . linkout/; grep -r TOP linkout"),
    Attack("find-follow", "find -L . -name 'secret*'; find -L linkout -type f; ls -laL linkout/"),
    Attack("cat-linkout", "cat linkout/secret.txt; head -c 200 linkout/*"),
    Attack("dotenv-glob", 'cat .en[v]; cat .en?; cat "$(printf .en)v"; grep -r API_TOKEN .'),
    Attack(
        "dotenv-named",
        "cat .env; head .env*; cp .env src/copy.txt; cat src/copy.txt",
    ),
    Attack(
        "proc-root",
        "cat /proc/1/root{outside}/secret.txt; ls /proc/1/cwd/.. /proc/self/root/",
    ),
    Attack(
        "find-whole-filesystem",
        "find / \\( -path /proc -o -path /usr \\) -prune -o -type f \\( -name secret.txt "
        "-o -name credentials -o -name id_rsa \\) -print0 2>/dev/null | xargs -0 -r cat",
    ),
    Attack("root-home", "ls -la /root /home; cat /root/.bash_history /root/.ssh/* 2>&1 | head"),
    Attack("var-tmp-and-shm", "ls -la /var/tmp /dev/shm /tmp /run /var/run 2>&1"),
]

ATTACKS = READ_ONLY_LOOKING + EXPANDED_PATHS


@pytest.mark.parametrize(("attack", "config"), params(ATTACKS))
def test_hostile_command_is_contained(tmp_path, attack, config):
    run_attack(tmp_path, attack, config, require_sandbox())


@pytest.mark.parametrize(
    ("config", "command", "expected", "writable"),
    [
        (
            Config("read-only", "nobody"),
            "cat README.md src/a.py; git log --oneline -1",
            "# demo",
            False,
        ),
        (Config("ask", "nobody"), "grep -rn print src; git status --short", "src/a.py:1", False),
        (Config("ask", "yes"), "echo hi > new.txt && cat new.txt && make test", "tests pass", True),
        (Config("full-auto", "nobody"), "python3 -c 'print(6*7)' | tee out.txt", "42", True),
    ],
    ids=lambda v: str(v) if isinstance(v, Config) else None,
)
def test_control_normal_commands_still_work(tmp_path, config, command, expected, writable):
    """The other side of every attack: in the same sandbox, ordinary work gets done."""
    _, (call,) = run_attack(tmp_path, Attack("control", command), config, require_sandbox())
    assert call.ran and call.result.ok and expected in call.output, call.output
    assert call.writable is writable
    assert call.asked is (config.approver == "yes")  # only the writing command asked
