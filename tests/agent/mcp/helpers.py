"""What the MCP tests share: the demo server, config files, an HTTP server process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent.core.mcp.config import McpConfig, load_config, user_config_file
from agent.core.mcp.manager import McpManager
from tools import default_tools
from tools.sandbox.bubblewrap import Sandbox, detect_sandbox

DEMO = Path(__file__).with_name("demo_server.py")
BUILTIN = [tool.name for tool in default_tools()]


def demo_entry(script: Path = DEMO, **extra: Any) -> dict[str, Any]:
    """A stdio entry that runs the demo server with this interpreter; in the sandbox the
    server's folder is granted read-only (the `read` grant of a user's entry)."""
    return {"command": sys.executable, "args": [str(script)], "read": [str(script.parent)], **extra}


def copy_demo(workspace: Path) -> Path:
    """The demo server inside the workspace, where the sandbox can see it."""
    target = workspace / "demo_server.py"
    shutil.copy(DEMO, target)
    return target


def write_config(path: Path, servers: dict[str, Any], **top: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers, **top}, indent=1))
    return path


def write_user_config(servers: dict[str, Any], **top: Any) -> Path:
    return write_config(user_config_file(), servers, **top)


def sandbox_for(workspace: Path) -> Sandbox | None:
    found = detect_sandbox(workspace)
    return found if isinstance(found, Sandbox) else None


def manager_for(
    workspace: Path, servers: dict[str, Any], *, sandboxed: bool = False
) -> tuple[McpManager, McpConfig]:
    """A started manager for `servers`, declared in a user's file (trusted) beside the
    workspace."""
    user_file = write_config(workspace.parent / f"{workspace.name}-user-mcp.json", servers)
    config = load_config(workspace, user_file=user_file)
    assert not config.problems, config.problems
    sandbox = sandbox_for(workspace) if sandboxed else None
    manager = McpManager(config, workspace, sandbox, reserved=BUILTIN)
    manager.start()
    return manager, config


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_http_server(port: int, timeout: float = 20.0) -> subprocess.Popen[bytes]:
    """The demo server on streamable HTTP, up and accepting connections."""
    process = subprocess.Popen(
        [sys.executable, str(DEMO), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            if process.poll() is not None:
                raise RuntimeError("the HTTP demo server exited") from None
            time.sleep(0.05)
    stop_process(process)
    raise RuntimeError("the HTTP demo server did not come up")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # an exited child not yet reaped is not alive either
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def processes_naming(text: str) -> list[int]:
    """Processes whose command line contains `text` (Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found
