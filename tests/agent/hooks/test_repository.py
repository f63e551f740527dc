"""A repository's hooks are its code: not run untrusted or changed, and confined when trusted."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from agent.core.events import Event
from agent.core.runtime import RuntimeOptions, open_runtime
from tests.agent.hooks.helpers import (
    PYTHON,
    has_sandbox,
    repository_hooks,
    trust_repository,
)
from tests.agent.scripted_server import Reply, ScriptedServer
from tools import ApprovalMode

PROBE = """
import json, os, socket, sys

port, outside, home = int(sys.argv[1]), sys.argv[2], sys.argv[3]
found = {}

def attempt(name, action):
    try:
        found[name] = "allowed: " + str(action())
    except Exception as err:
        found[name] = "denied: " + type(err).__name__

def write(path):
    with open(path, "w") as handle:
        handle.write("planted")
    return path

def read(path):
    with open(path) as handle:
        return handle.read()

attempt("outside", lambda: write(outside))
attempt("interpreter", lambda: write(os.path.join(sys.prefix, "planted-by-hook")))
attempt("workspace", lambda: write("inside.txt"))
attempt("ssh", lambda: read(os.path.join(home, ".ssh", "id_rsa")))
attempt("network", lambda: socket.create_connection(("127.0.0.1", port), timeout=2).close())
print(json.dumps({"additional_context": json.dumps(found)}))
"""


def open_session(approval=ApprovalMode.FULL_AUTO, task="look"):
    """Open a session (session_start hooks run), run one task; (events, first request)."""

    async def go():
        events: list[Event] = []
        with ScriptedServer([Reply("ok")]) as model:
            runtime = await open_runtime(
                RuntimeOptions(attach=model.url, approval=approval), [events.append]
            )
            await runtime.agent.run_task(task)
            await runtime.close()
            return events, model.requests[0]

    return asyncio.run(go())


def errors(events, kind):
    return [e for e in events if e.type == "error" and e.kind == kind]


# Probed on an empty folder: /tmp itself may hold more secret-looking files than
# one bwrap command line can mask.
def _sandbox_here() -> bool:
    with tempfile.TemporaryDirectory(prefix="resident-probe-") as empty:
        return has_sandbox(Path(empty))


needs_sandbox = pytest.mark.skipif(not _sandbox_here(), reason="no bubblewrap sandbox here")


@needs_sandbox
def test_untrusted_hooks_do_not_run_and_the_user_is_told_how_to_trust(repo):
    repository_hooks(repo, {"session_start": [{"command": "touch marker"}]})
    events, _ = open_session()
    assert not (repo / "marker").exists()
    assert [e for e in events if e.type == "hook"] == []
    (notice,) = errors(events, "hook_trust")
    assert "not trusted" in notice.message and "resident hooks trust" in notice.message

    trust_repository(repo)  # the same file, trusted: now it runs (so the test can tell)
    open_session()
    assert (repo / "marker").exists()


@needs_sandbox
def test_a_trusted_file_that_changed_does_not_run(repo):
    repository_hooks(repo, {"session_start": [{"command": "touch marker"}]})
    trust_repository(repo)
    repository_hooks(repo, {"session_start": [{"command": "touch marker; touch more"}]})
    events, _ = open_session()
    assert not (repo / "marker").exists() and not (repo / "more").exists()
    (notice,) = errors(events, "hook_trust")
    assert "changed since you trusted it" in notice.message


def test_without_a_sandbox_a_trusted_repository_hook_does_not_run(repo, monkeypatch):
    monkeypatch.setenv("RESIDENT_NO_SANDBOX", "1")
    repository_hooks(repo, {"session_start": [{"command": "touch marker"}]})
    trust_repository(repo)
    events, _ = open_session()
    assert not (repo / "marker").exists()
    (notice,) = errors(events, "hook_trust")
    assert "only inside the sandbox" in notice.message


@pytest.fixture
def listener():
    """A loopback TCP server that counts the connections it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[object] = []

    def serve():
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            accepted.append(connection)
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    server.close()
    thread.join(timeout=5)


@needs_sandbox
@pytest.mark.parametrize("approval", [ApprovalMode.ASK, ApprovalMode.FULL_AUTO])
def test_a_trusted_hook_is_confined_to_what_the_mode_allows(
    repo, tmp_path, monkeypatch, listener, approval
):
    port, accepted = listener
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("SECRET-KEY-123")
    monkeypatch.setenv("HOME", str(home))
    outside = tmp_path / "outside.txt"
    (repo / "probe.py").write_text(PROBE)
    command = f"{PYTHON} probe.py {port} {outside} {home}"
    repository_hooks(repo, {"session_start": [{"command": command, "name": "probe"}]})
    trust_repository(repo)

    planted = Path(sys.prefix) / "planted-by-hook"
    try:
        events, request = open_session(approval)
    finally:
        host_changed = planted.exists()
        planted.unlink(missing_ok=True)
    (ran,) = [e for e in events if e.type == "hook"]
    assert ran.outcome == "allowed" and ran.source == "repository", ran.message
    found = json.loads(ran.message)
    # Outside the workspace the hook sees a private tmpfs (its writes vanish with it) or
    # read-only binds; nothing reaches the host.
    assert not outside.exists() and not host_changed
    assert found["interpreter"].startswith("denied")
    assert found["ssh"].startswith("denied")
    assert found["network"].startswith("denied") and accepted == []
    if approval is ApprovalMode.FULL_AUTO:  # what an unasked command may do in full-auto
        assert found["workspace"].startswith("allowed") and (repo / "inside.txt").exists()
    else:
        assert found["workspace"].startswith("denied") and not (repo / "inside.txt").exists()
    everything = json.dumps(request) + "".join(e.model_dump_json() for e in events)
    assert "SECRET-KEY-123" not in everything
