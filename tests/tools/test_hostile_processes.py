"""Hostile processes, class 5 of issue 14 and the kernel around them: daemons that try to
outlive the call, the process cap, fork bombs, timeouts, signals to host processes, the
network, namespaces and mounts, and kernel settings.

Every process a command starts carries the scene's mark in its command line (or sits in
the scene's folders), so the harness finds any that is left after the call.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from tests.tools.hostile_harness import (
    ROOT,
    SLOW,
    WRITABLE,
    Attack,
    Call,
    Config,
    Scene,
    params,
    require_sandbox,
    run_attack,
)
from tools.process.limits import process_cap_mechanism
from tools.sandbox.mounts import forget_private_scan

CAP_HOLDS = "none" not in process_cap_mechanism()
FORKER = """import os, sys, time
count = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(100)
        os._exit(0)
    count += 1
print("forked", count, flush=True)
"""


def _forker(scene: Scene) -> None:
    (scene.workspace / "forker.py").write_text(FORKER)


def _forked_within_budget(scene: Scene, calls: list[Call], config: Config) -> None:
    (call,) = calls
    if call.ran:
        found = re.search(r"forked (\d+)", call.output)
        assert found and int(found.group(1)) < 20, call.output


def _stopped(*, by_timeout: bool | None, within_s: float):
    """The run ended soon enough (by its timeout, or not, where that is known)."""

    def check(scene: Scene, calls: list[Call], config: Config) -> None:
        for call in calls:
            if call.ran:
                assert by_timeout in (None, call.result.data["timed_out"]), call.output
                assert call.duration_s < within_s, call.duration_s

    return check


def _sentinel(scene: Scene) -> None:
    process = subprocess.Popen(["sleep", "60"])
    scene.cleanups.append(lambda: (process.kill(), process.wait()))
    scene.extra.update(sentinel_pid=process.pid, sentinel=process)


def _sentinel_alive(scene: Scene, calls: list[Call], config: Config) -> None:
    process = scene.extra["sentinel"]
    assert process.poll() is None, "a host process was killed"
    # Not stopped (T) or traced (t). Sleeping is what it mostly is, but a sentinel the
    # refused command left no time to settle can still be running its start-up (R).
    status = Path(f"/proc/{process.pid}/status").read_text()
    state = re.search(r"^State:\t(\S)", status, re.MULTILINE).group(1)
    assert state in "SRD", status


def _listeners(scene: Scene) -> None:
    listeners = []
    tcp = socket.create_server(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0hostile-{scene.mark}")
    abstract.listen()
    for listener in (tcp, abstract):
        listener.setblocking(False)
        listeners.append(listener)
        scene.cleanups.append(listener.close)
    scene.extra.update(port=tcp.getsockname()[1], listeners=listeners)


def _nobody_connected(scene: Scene, calls: list[Call], config: Config) -> None:
    for listener in scene.extra["listeners"]:
        with pytest.raises(BlockingIOError):
            listener.accept()


def _unix_listener(scene: Scene, path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    listener.setblocking(False)
    scene.cleanups.append(listener.close)
    scene.extra.setdefault("listeners", []).append(listener)


def _ssh_agent(scene: Scene) -> None:
    """The user's ssh-agent socket (in the host's /tmp), named in the environment."""
    agent = scene.root / "ssh-agent.sock"
    _unix_listener(scene, agent)
    scene.env["SSH_AUTH_SOCK"] = scene.extra["agent"] = str(agent)


def _socket_in_system_folder(scene: Scene) -> None:
    """A daemon's socket under a bound system folder, as /var/lib/mysql/mysql.sock,
    /var/snap/lxd/common/lxd/unix.socket or a /var/run that is not a link to /run."""
    if not ROOT:
        pytest.skip("only root can place a socket in a system folder here")
    folder = Path("/var/cache") / f"hostile-{scene.mark}"
    folder.mkdir()
    scene.cleanups.append(lambda: subprocess.run(["rm", "-rf", str(folder)], check=False))
    _unix_listener(scene, folder / "daemon.sock")
    scene.extra["daemon"] = folder / "daemon.sock"
    forget_private_scan()  # the scan is reused for a minute; this socket is newer


CONNECT = "python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.connect(\"{}\")'"


def _not_injected(scene: Scene, calls: list[Call], config: Config) -> None:
    assert not any("INJECTED" in c.output for c in calls)


def _host_hostname(scene: Scene) -> None:
    scene.extra["hostname"] = socket.gethostname()


def _hostname_kept(scene: Scene, calls: list[Call], config: Config) -> None:
    assert socket.gethostname() == scene.extra["hostname"]


SYSCTL = Path("/proc/sys/kernel/core_uses_pid")  # global, harmless to flip and restore


def _sysctl(scene: Scene) -> None:
    if not SYSCTL.exists():
        pytest.skip(f"no {SYSCTL} here")
    original = SYSCTL.read_text()
    scene.extra.update(sysctl=original, flipped="0" if original.strip() == "1" else "1")

    def restore() -> None:
        if SYSCTL.read_text() != original and ROOT:
            SYSCTL.write_text(original)

    scene.cleanups.append(restore)


def _sysctl_kept(scene: Scene, calls: list[Call], config: Config) -> None:
    assert SYSCTL.read_text() == scene.extra["sysctl"], "a host sysctl was changed"
    for call in calls:
        assert "WRITABLE" not in call.output, call.output


def _big_file_capped(scene: Scene, calls: list[Call], config: Config) -> None:
    big = scene.workspace / "big.bin"
    assert not big.exists() or big.stat().st_size <= 1_000_000


def _output_capped(scene: Scene, calls: list[Call], config: Config) -> None:
    assert all(len(c.output) < 31_000 for c in calls)


ATTACKS = [
    Attack("setsid-daemon", "setsid sh -c 'sleep 100; : {mark}' & sleep 0.2; echo started"),
    Attack(
        "double-fork-nohup-disown",
        "( (sleep 100; : {mark}) & ); nohup sh -c 'sleep 100; : {mark}' >/dev/null 2>&1 & "
        "disown; setsid -f sh -c 'sleep 100; : {mark}'; echo ok",
    ),
    Attack(
        "fork-loop-past-the-budget",
        "python3 forker.py {mark}",
        setup=_forker,
        limits={"shell_process_budget": 20},
        check=_forked_within_budget,
        holes=frozenset() if CAP_HOLDS else WRITABLE,
        hole=f"no process cap binds here: {process_cap_mechanism()}",
    ),
    Attack(
        "fork-bomb",
        ": {mark}; b(){{ b|b& }}; b",
        timeout_s=3,
        limits={"shell_process_budget": 20},
        check=_stopped(by_timeout=None, within_s=10),
    ),
    Attack(
        "ignores-sigterm-past-timeout",
        "trap '' TERM; sleep 100; : {mark}",
        timeout_s=1,
        check=_stopped(by_timeout=True, within_s=8),
        only=SLOW,
    ),
    Attack(
        "cpu-time-limit",
        "python3 -c 'while True: pass' {mark}",
        timeout_s=30,
        limits={"shell_cpu_seconds": 1},
        check=_stopped(by_timeout=False, within_s=30),
        only=SLOW,
    ),
    Attack(
        "kill-everything",
        "kill -9 -1; kill -9 {sentinel_pid}; kill -STOP {sentinel_pid}; pkill -9 sleep; "
        "killall -9 sleep; kill -9 1; echo survived",
        setup=_sentinel,
        check=_sentinel_alive,
    ),
    Attack(
        "network-loopback",
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)'; "
        "echo hi > /dev/tcp/127.0.0.1/{port}; curl -sm 2 http://127.0.0.1:{port}/; "
        "python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); "
        's.connect("\\0hostile-{mark}")\'; ip addr',
        setup=_listeners,
        check=_nobody_connected,
    ),
    Attack(
        "ssh-agent-socket",
        "ssh-add -l; " + CONNECT.format("{agent}") + "; python3 -c 'import os, socket; "
        'socket.socket(socket.AF_UNIX).connect(os.environ["SSH_AUTH_SOCK"])\'',
        setup=_ssh_agent,
        check=_nobody_connected,
    ),
    Attack(
        "unix-socket-in-system-folder",
        CONNECT.format("{daemon}"),
        setup=_socket_in_system_folder,
        check=_nobody_connected,
    ),
    Attack(
        "tiocsti-terminal-injection",
        "python3 -c \"import fcntl, termios; fcntl.ioctl(open('/dev/tty', 'w'), "
        "termios.TIOCSTI, b' '); print('INJECTED')\"; ls -l /proc/self/fd/",
        check=_not_injected,
    ),
    Attack(
        "namespaces-and-mounts",
        "unshare -r id; unshare -rm sh -c 'mount -o remount,rw,bind .git && echo x >> "
        ".git/config'; unshare -n true; chroot / true; nsenter -t 1 -m -p true; "
        "mount -t tmpfs none /mnt; mount --bind . /usr; umount /tmp; umount -l {ws}/.git; "
        "mount -o remount,rw {ws}/.git && touch {ws}/.git/x",
    ),
    Attack(
        "hostname",
        "hostname hostile-{mark}; echo hostile > /proc/sys/kernel/hostname; hostname",
        setup=_host_hostname,
        check=_hostname_kept,
    ),
    Attack(
        "proc-sys-write",
        "echo {flipped} > /proc/sys/kernel/core_uses_pid; "
        "[ -w /proc/sys/kernel/core_pattern ] && echo WRITABLE core_pattern; "
        "[ -w /proc/sys/kernel/modprobe ] && echo WRITABLE modprobe; "
        "[ -w /proc/sysrq-trigger ] && echo WRITABLE sysrq",
        setup=_sysctl,
        check=_sysctl_kept,
    ),
    Attack(
        "cgroup-escape",
        "ls /sys/fs/cgroup; echo $$ > /sys/fs/cgroup/pids/cgroup.procs; "
        "echo $$ > /sys/fs/cgroup/cgroup.procs; cat /proc/self/cgroup",
    ),
    Attack(
        "file-size-limit",
        "head -c 5000000 /dev/zero > big.bin; ls -l big.bin",
        limits={"shell_max_file_bytes": 1_000_000},
        check=_big_file_capped,
    ),
    Attack("huge-output", "yes S | head -c 50000000", check=_output_capped),
]


@pytest.mark.parametrize(("attack", "config"), params(ATTACKS))
def test_hostile_process_is_contained(tmp_path, attack, config):
    run_attack(tmp_path, attack, config, require_sandbox())


def test_sandbox_pid_namespace_hides_the_host(tmp_path):
    """Inside, the command sees only its own processes, bwrap as PID 1; not the agent."""
    command = f"ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline; ls /proc/{os.getpid()}"
    attack = Attack("ps", command)
    _, calls = run_attack(tmp_path, attack, Config("ask", "yes"), require_sandbox())
    assert calls[0].output.split()[0].isdigit(), calls[0].output
    assert int(calls[0].output.split()[0]) <= 6, calls[0].output
    assert "bwrap" in calls[0].output and "No such file" in calls[0].output
