"""Commands get their limits from an exec-only launcher (sh, then prlimit), not a preexec
function: a preexec function makes Python fork() the whole agent process, which with the
default model loaded cost 65 ms a command. The limits must be the same either way."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.process import limits as limits_module
from tools.process import run as run_module
from tools.process.limits import Limits, limited_argv
from tools.process.run import run_process

needs_prlimit = pytest.mark.skipif(shutil.which("prlimit") is None, reason="no prlimit here")
LIMITS = Limits(processes=None, cpu_seconds=7, file_bytes=123_456)


def _limits_seen(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """The command's own /proc/self/limits: name -> (soft, hard)."""
    outcome = run_process(
        ["cat", "/proc/self/limits"],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"]},
        timeout_s=10,
        output_limit=100_000,
        limits=LIMITS,
    )
    assert outcome.succeeded, outcome.output
    seen = {}
    for line in outcome.output.splitlines()[1:]:
        name = line[:26].strip()
        soft, hard = line[26:].split()[:2]
        seen[name] = (soft, hard)
    return seen


def _expected() -> dict[str, tuple[str, str]]:
    def shown(value: int) -> str:
        return "unlimited" if value == resource.RLIM_INFINITY else str(value)

    cpu = limits_module._capped(resource.RLIMIT_CPU, 7, 12)
    fsize = limits_module._capped(resource.RLIMIT_FSIZE, 123_456, 123_456)
    return {
        "Max core file size": ("0", "0"),
        "Max cpu time": tuple(map(shown, cpu)),
        "Max file size": tuple(map(shown, fsize)),
    }


@needs_prlimit
def test_the_launcher_sets_the_limits_without_a_preexec_function(tmp_path, monkeypatch):
    preexec = []
    popen = subprocess.Popen

    def recording(*args, **kwargs):
        preexec.append(kwargs.get("preexec_fn"))
        return popen(*args, **kwargs)

    monkeypatch.setattr(run_module.subprocess, "Popen", recording)
    seen = _limits_seen(tmp_path)
    assert preexec == [None]  # Python may vfork: no copy of the agent's page tables
    for name, values in _expected().items():
        assert seen[name] == values, name


def test_without_prlimit_the_preexec_function_sets_the_same_limits(tmp_path, monkeypatch):
    monkeypatch.setattr(limits_module, "_prlimit", lambda: None)
    assert limited_argv(["true"], LIMITS, None, None) is None
    seen = _limits_seen(tmp_path)
    for name, values in _expected().items():
        assert seen[name] == values, name


@needs_prlimit
def test_a_cgroup_that_cannot_be_joined_stops_the_command(tmp_path):
    """Fail closed: the command never runs outside its process cap."""

    class Unjoinable:
        procs_path = os.fsencode(tmp_path / "missing" / "cgroup.procs")

    marker = tmp_path / "ran"
    argv = limited_argv(["touch", str(marker)], LIMITS, None, Unjoinable())
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    assert done.returncode == 126 and not marker.exists(), done


@needs_prlimit
def test_arguments_pass_through_the_launcher_untouched(tmp_path):
    tricky = ["$HOME", "a b", "'quoted'", "--", "-c", "; echo injected", ""]
    argv = limited_argv(["printf", "[%s]\\n", *tricky], LIMITS, None, None)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"[{arg}]" for arg in tricky]
