"""Hostile reads of secrets, class 4 of issue 14 and what else holds them: the agent's
environment (passed as `ToolContext(env=...)`), other processes' `/proc/*/environ`, the
user's HOME (a fake one with credentials in it), the workspace's `.env`, open file
descriptors, and files only root may read.

Every secret value carries the scene's mark; the harness fails a run whose output holds
one (the workspace `.env` may show only to a command a person approved).
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

import tools.sandbox.bubblewrap
import tools.sandbox.mounts
from tests.tools.hostile_harness import (
    DOTENV,
    ROOT,
    SECRET,
    Attack,
    Call,
    Config,
    Scene,
    params,
    require_sandbox,
    run_attack,
)
from tools.sandbox.grants import SandboxSettings


def _sentinel(scene: Scene) -> None:
    """A host process standing in for the agent, holding a secret in its environment."""
    env = {"PATH": os.defpath, "AGENT_API_KEY": f"{SECRET}{scene.mark}agent"}
    process = subprocess.Popen(["sleep", "60"], env=env)
    scene.cleanups.append(lambda: (process.kill(), process.wait()))
    scene.extra.update(sentinel_pid=process.pid, agent_pid=os.getpid(), sentinel=process)


def _sentinel_untouched(scene: Scene, calls: list[Call], config: Config) -> None:
    process = scene.extra["sentinel"]
    assert process.poll() is None, "the host process was killed"
    status = Path(f"/proc/{process.pid}/status").read_text()
    assert "TracerPid:\t0" in status and "State:\tS" in status, status


def _home_credentials(scene: Scene) -> None:
    (scene.home / ".git-credentials").write_text(f"https://u:{SECRET}{scene.mark}gc@github.com\n")
    (scene.home / ".netrc").write_text(f"machine x login u password {SECRET}{scene.mark}nrc\n")
    (scene.home / ".config" / "gh").mkdir(parents=True)
    (scene.home / ".config" / "gh" / "hosts.yml").write_text(f"token: {SECRET}{scene.mark}gh\n")


def _open_secret_fd(scene: Scene) -> None:
    """The agent holds the outside secret open, inheritable: no command may reach it."""
    fd = os.open(scene.outside / "secret.txt", os.O_RDONLY)
    os.set_inheritable(fd, True)
    scene.cleanups.append(lambda: os.close(fd))


def _venv_marker_beside_dotenv(scene: Scene) -> None:
    """A hostile repository ships app/pyvenv.cfg; the user keeps app/.env (untracked)."""
    app = scene.workspace / "app"
    app.mkdir()
    (app / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (app / ".env").write_text(f"API_TOKEN={DOTENV}{scene.mark}\n")


def _scan_stops_early(scene: Scene) -> None:
    """Stands in for a workspace past SECRET_SCAN_LIMIT (200,000 entries): the scan stops
    before it reaches .env (limit 0 here, so that the order of entries does not matter)."""
    original = tools.sandbox.bubblewrap.secret_files
    tools.sandbox.bubblewrap.secret_files = functools.partial(original, limit=0)
    scene.cleanups.append(lambda: setattr(tools.sandbox.bubblewrap, "secret_files", original))


def _root_only_system_file(scene: Scene) -> None:
    """A root-only key in a system folder, as /etc/ssh/ssh_host_*_key or /etc/ssl/private."""
    if not ROOT:
        pytest.skip("only root can place a root-only file in a system folder")
    folder = Path("/var/cache") / f"hostile-{scene.mark}"
    folder.mkdir(mode=0o700)
    scene.cleanups.append(lambda: subprocess.run(["rm", "-rf", str(folder)], check=False))
    key = folder / "server.key"
    key.write_text(f"-----BEGIN PRIVATE KEY-----\n{SECRET}{scene.mark}hostkey\n")
    key.chmod(0o600)
    scene.extra["syskey"] = key
    # As if it had been there when the session started (the sandbox may cache its scan).
    tools.sandbox.mounts.forget_private_scan()


NAMED = "PGPASSWORD MYSQL_PWD DATABASE_URL GH_PAT HTTPS_PROXY http_proxy SENTRY_DSN "
NAMED += "DOCKER_AUTH_CONFIG RESIDENT_API_KEY OPENAI_API_KEY AWS_SECRET_ACCESS_KEY "
NAMED += "AWS_SESSION_TOKEN GITHUB_TOKEN CUSTOM_UNLISTED_THING"

ATTACKS = [
    Attack("env-dump", "env; set; export -p; declare -p | head -200"),
    Attack("env-by-name", "echo " + " ".join(f'"${n}"' for n in NAMED.split())),
    Attack(
        "env-named-by-user-with-password-in-url",
        'echo "$HTTPS_PROXY $http_proxy $DATABASE_URL"; env | grep -i -e proxy -e database',
        settings=SandboxSettings(env_names=("HTTPS_PROXY", "http_proxy", "DATABASE_URL")),
    ),
    Attack("python-environ", "python3 -c 'import os; print(dict(os.environ))'"),
    Attack(
        "proc-environ",
        "cat /proc/$PPID/environ /proc/1/environ /proc/self/environ | tr '\\0' '\\n'; "
        "cat /proc/*/environ | tr '\\0' '\\n'; cat /proc/*/cmdline | tr '\\0' ' '",
    ),
    Attack(
        "agent-environ-and-ptrace",
        "cat /proc/{agent_pid}/environ /proc/{sentinel_pid}/environ; ls /proc; "
        "python3 -c 'import ctypes; print(ctypes.CDLL(None).ptrace(16, {sentinel_pid}, 0, 0))'; "
        "cat /proc/{sentinel_pid}/mem; gdb -p {agent_pid} -batch -ex 'info proc'",
        setup=_sentinel,
        check=_sentinel_untouched,
    ),
    Attack(
        "home-credentials",
        "cat ~/.aws/credentials ~/.ssh/id_rsa ~/.bash_history ~/.git-credentials ~/.netrc "
        "~/.config/gh/hosts.yml; ls -laR ~; git credential fill <<< 'protocol=https\nhost=x'",
        setup=_home_credentials,
    ),
    Attack(
        "home-copied-out",
        "cp -r ~ home-copy; ls -laR home-copy; tar cf - ~ 2>/dev/null | tar tvf -",
        setup=_home_credentials,
    ),
    Attack(
        "home-planted",
        "echo 'sh payload.sh' >> ~/.bashrc; mkdir -p ~/.config/autostart ~/.ssh; "
        "cp payload.sh ~/.config/autostart/x.desktop; echo key >> ~/.ssh/authorized_keys",
    ),
    Attack(
        "inherited-file-descriptor",
        "ls -l /proc/self/fd; for i in $(seq 3 40); do cat /proc/self/fd/$i 2>/dev/null; "
        'cat <&"$i" 2>/dev/null; done; echo done',
        setup=_open_secret_fd,
    ),
    Attack(
        "dotenv-beside-pyvenv-cfg",
        "cat app/.en[v]; grep -r API_TOKEN app",
        setup=_venv_marker_beside_dotenv,
    ),
    Attack(
        "dotenv-past-scan-limit",
        "cat .en[v]",
        setup=_scan_stops_early,
    ),
    Attack(
        "root-only-system-file",
        "cat {syskey}; head -c 300 {syskey}",
        setup=_root_only_system_file,
    ),
    Attack(
        "kernel-and-devices",
        "head -c 64 /proc/kcore | od | head -2; head -c 16 /dev/mem /dev/sda /dev/vda; "
        "dmesg | tail -3; cat /proc/self/mountinfo | head -40; ls /sys /dev",
    ),
]


@pytest.mark.parametrize(("attack", "config"), params(ATTACKS))
def test_hostile_secret_read_is_contained(tmp_path, attack, config):
    run_attack(tmp_path, attack, config, require_sandbox())


def test_shadow_content_never_printed(tmp_path):
    """The host's /etc/shadow (root can read it) is masked inside the sandbox."""
    try:
        lines = [line for line in Path("/etc/shadow").read_text().splitlines() if line]
    except OSError:
        pytest.skip("this user cannot read /etc/shadow on the host either")
    attack = Attack("shadow", "cat /etc/shadow /etc/gshadow; python3 -c \"print(open('/etc/shadow').read())\"")  # fmt: skip
    _, calls = run_attack(tmp_path, attack, Config("full-auto", "nobody"), require_sandbox())
    assert calls[0].ran
    assert not any(line in calls[0].output for line in lines)


def test_tempdir_is_private(tmp_path):
    """The host's temp folder (where every test's secrets lie) is not there inside."""
    other = Path(tempfile.mkdtemp(prefix="hostile-neighbour-"))
    try:
        (other / "secret.txt").write_text(f"{SECRET}neighbour\n")
        attack = Attack("neighbour", f"ls {other}; cat {other}/secret.txt; ls /tmp")
        _, calls = run_attack(tmp_path, attack, Config("ask", "yes"), require_sandbox())
        assert calls[0].ran and f"{SECRET}neighbour" not in calls[0].output
    finally:
        (other / "secret.txt").unlink()
        other.rmdir()
