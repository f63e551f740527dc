"""The agent and its sandbox: named at start, fail closed without one, the process guarded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.agent.helpers import attached, run_cli
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tools.sandbox.bubblewrap import SandboxUnavailable, detect_sandbox


def test_session_started_names_the_sandbox_and_commands_run_in_it(repo):
    script = [Reply("", [call("shell", command="ls /proc | grep -c '^[0-9]'")]), Reply("Done.")]
    with ScriptedServer(script) as server:
        result = run_cli("look", *attached(server.url))
    started = result.of_type("session_started")[0]
    if isinstance(detect_sandbox(repo), SandboxUnavailable):
        assert started["sandbox"].startswith("none: ")
        return
    assert started["sandbox"].startswith("bubblewrap ")
    outcome = result.of_type("tool_result")[0]
    assert outcome["ok"] and outcome["data"]["sandbox"] == "read-only, network off"
    assert int(outcome["output"].split()[0]) < 10  # its own PID namespace


def test_without_a_sandbox_the_run_says_so_and_every_command_asks(repo, monkeypatch):
    monkeypatch.setenv("RESIDENT_NO_SANDBOX", "1")
    script = [Reply("", [call("shell", command="ls")]), Reply("Done.")]
    with ScriptedServer(script) as server:
        result = run_cli("look", *attached(server.url))
    assert "no sandbox" in result.stderr and "needs approval" in result.stderr
    assert result.of_type("session_started")[0]["sandbox"].startswith("none: ")
    asked = result.of_type("approval_requested")
    assert asked and "no sandbox" in asked[0]["reason"]
    assert result.exit_code == 3  # nobody in a headless run can approve even `ls`


def test_read_only_mode_offers_no_shell_without_a_sandbox(repo, monkeypatch):
    monkeypatch.setenv("RESIDENT_NO_SANDBOX", "1")
    script = [Reply("", [call("shell", command="ls")]), Reply("Done.")]
    with ScriptedServer(script) as server:
        result = run_cli("look", *attached(server.url, "--approval", "read-only"))
    outcome = result.of_type("tool_result")[0]
    assert not outcome["ok"] and "offers no shell" in outcome["output"]


_GUARDED = """
import ctypes, json, os, subprocess, sys
from agent.core.process_guard import guard_agent_process
guard_agent_process()
libc = ctypes.CDLL(None)
child = subprocess.run(["env"], capture_output=True, text=True).stdout
print(json.dumps({"dumpable": libc.prctl(3, 0, 0, 0, 0), "child": child,
                  "data_dir": os.environ.get("RESIDENT_DATA_DIR")}))
"""


def test_the_agent_process_is_not_dumpable_and_keeps_no_keys(tmp_path):
    env = {
        **os.environ,
        "RESIDENT_API_KEY": "resident-secret",
        "OPENAI_API_KEY": "openai-secret",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "RESIDENT_DATA_DIR": str(tmp_path),
    }
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run(
        [sys.executable, "-c", _GUARDED], env=env, cwd=root, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["dumpable"] == 0
    for secret in ("resident-secret", "openai-secret", "aws-secret"):
        assert secret not in report["child"]
    assert report["data_dir"] == str(tmp_path)  # configuration stays
