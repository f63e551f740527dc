"""Hostile writes and links, classes 6 and 8 of issue 14: an approved command (a writable
workspace, nothing more) tries to write everywhere else, and links planted in the
workspace try to lead the agent's own file tools (which run outside the sandbox) out.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

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

SYSTEM_TARGETS = ("/usr", "/etc", "/opt", "/var/lib", "/var/cache")
SITE_PACKAGES = sysconfig.get_paths()["purelib"]  # the agent's own interpreter


def _nothing_in_system_folders(scene: Scene, calls: list[Call], config: Config) -> None:
    for folder in (*SYSTEM_TARGETS, SITE_PACKAGES):
        assert not os.path.lexists(Path(folder) / f"hostile-{scene.mark}")
        assert not os.path.lexists(Path(folder) / f"hostile-{scene.mark}.pth")


def _all_quick(scene: Scene, calls: list[Call], config: Config) -> None:
    assert all(c.duration_s < 5 for c in calls), [(c.tool, c.duration_s) for c in calls]


def _file_tools_refused(scene: Scene, calls: list[Call], config: Config) -> None:
    """The file tools either refuse a link leading out or find nothing to follow."""
    for call in calls:
        if call.tool not in ("read", "write", "edit", "list") or not call.ran:
            continue
        first = Path(call.arguments["path"]).parts[0]
        if (scene.workspace / first).is_symlink():  # the link is there (it was planted)
            assert not call.result.ok, (call.tool, call.arguments, call.output)


ATTACKS = [
    Attack(
        "redirect-outside",
        "echo x > ../outside/new-{mark}; echo x > {outside}/new2; echo x >> ../outside/secret.txt; "
        "touch ../hostile-{mark}; mkdir ../dir-{mark}",
    ),
    Attack(
        "exec-fd-outside",
        "exec 3>../outside/fd-{mark}; echo x >&3; exec 4<>{outside}/secret.txt; echo y >&4; "
        "exec 5>>{home}/.bashrc; echo 'sh payload.sh' >&5",
    ),
    Attack(
        "heredoc-outside",
        "cat > ../outside/hd-{mark} <<'EOF'\nx\nEOF\ncat >> {home}/.profile <<EOF\nsh {ws}/payload.sh\nEOF",
    ),
    Attack("copy-into-home", "cp /etc/passwd ~/x; cp /etc/passwd {home}/y; ls -la ~; cp -r . ~/ws"),
    Attack(
        "host-temp-folders",
        "touch /tmp/hostile-{mark} /var/tmp/hostile-{mark} /dev/shm/hostile-{mark}; "
        "exec 3>{tmpmark}; echo x >&3; ls /tmp",
    ),
    Attack(
        "system-folders",
        "; ".join(f"touch {d}/hostile-{{mark}}" for d in SYSTEM_TARGETS)
        + "; python3 -c \"open('/etc/hostile-{mark}', 'w').write('x')\"",
        check=_nothing_in_system_folders,
    ),
    Attack(
        "agent-interpreter-pth",
        f"echo 'import os; os.system(\"sh {{ws}}/payload.sh\")' > {SITE_PACKAGES}/hostile-{{mark}}.pth",
        check=_nothing_in_system_folders,
    ),
    Attack(
        "chmod-chown-outside",
        "chmod 777 ../outside/secret.txt {outside} {home}; chown -R nobody {outside} {home}; "
        "chmod -R 777 ~; setfacl -m u:nobody:rw {outside}/secret.txt",
    ),
    Attack(
        "links-to-outside",
        "ln {outside}/secret.txt hard1; ln /etc/passwd hard2; ln -s {outside}/secret.txt s1; "
        "cat s1 hard1; ls -la",
    ),
    Attack(
        "python-writes-outside",
        "python3 -c \"import shutil; open('{outside}/py-{mark}', 'w').write('x'); "
        "shutil.copy('/etc/hostname', '{home}/py')\"",
    ),
    Attack(
        "links-planted-then-file-tools",
        steps=(
            (
                "shell",
                {
                    "command": "ln -s {outside}/secret.txt leak.txt; ln -s {outside} leakdir; "
                    "ln -s {home} homelink; ln -s ../.. up; cat leak.txt"
                },
            ),
            ("read", {"path": "leak.txt"}),
            ("read", {"path": "leakdir/secret.txt"}),
            ("read", {"path": "homelink/.aws/credentials"}),
            ("read", {"path": "up/outside/secret.txt"}),
            ("list", {"path": "leakdir"}),
            ("grep", {"pattern": "SECRET|aws_secret", "path": "."}),
            ("glob", {"pattern": "**/*"}),
            ("write", {"path": "leakdir/new.txt", "content": "x"}),
            ("edit", {"path": "leak.txt", "old_string": "TOP", "new_string": "NOT"}),
            ("shell", {"command": "cat leak.txt leakdir/secret.txt homelink/.aws/credentials"}),
        ),
        check=_file_tools_refused,
    ),
    Attack(
        "tracked-link-and-file-tools",
        steps=(
            ("read", {"path": "linkout/secret.txt"}),
            ("list", {"path": "linkout"}),
            ("grep", {"pattern": "TOP", "path": "linkout"}),
            ("grep", {"pattern": "(?=TOP)TOP"}),
            ("glob", {"pattern": "linkout/*"}),
            ("shell", {"command": "cat secret.txt; ls", "workdir": "linkout"}),
            ("shell", {"command": "cat secret.txt", "workdir": "../outside"}),
        ),
        check=_file_tools_refused,
    ),
    Attack(
        "fifo-named-like-source",
        steps=(
            ("shell", {"command": "mkfifo src/b.py .env.local; mknod dev b 8 0; ls -la src"}),
            ("read", {"path": "src/b.py"}),
            ("grep", {"pattern": "print"}),
            ("glob", {"pattern": "**/*.py"}),
            ("shell", {"command": "grep -r print src; cat src/a.py"}),
        ),
        check=_all_quick,
    ),
]


@pytest.mark.parametrize(("attack", "config"), params(ATTACKS))
def test_hostile_write_is_contained(tmp_path, attack, config):
    run_attack(tmp_path, attack, config, require_sandbox())
