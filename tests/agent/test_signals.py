"""Ctrl-C on a real `resident run` process: a clean stop with exit code 130."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from tests.agent.scripted_server import Reply, ScriptedServer, wait_for


def test_sigint_stops_the_run_with_130(repo):
    with ScriptedServer([Reply("Working on it", stall=True)]) as server:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent.cli",
                "run",
                "slow task",
                "--attach",
                server.url,
                "--json",
            ],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(server.stalled, timeout=60)
            process.send_signal(signal.SIGINT)
            stdout, stderr = process.communicate(timeout=30)
        finally:
            process.kill()
    assert process.returncode == 130, stderr
    events = [json.loads(line) for line in stdout.splitlines()]
    assert events[-1]["type"] == "session_completed" and events[-1]["exit_code"] == 130
    assert [e["finish_reason"] for e in events if e["type"] == "turn_completed"] == ["interrupted"]
