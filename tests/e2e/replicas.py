"""Replicas and routers for the worker and router tests.

A replica is the engine as `resident serve` builds it (AsyncEngine.open) behind the
real app, served by uvicorn on a free loopback port in a thread of the test
process; a router is its real binary, a child process on a free port, stopped by
its PID whatever the test did.
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from engine.server.app import create_app
from engine.server.background import BackgroundServer
from engine.server.served_model import ServedModel


@contextlib.contextmanager
def replica(model_dir: Path, api_key: str | None, **config) -> Iterator[BackgroundServer]:
    """One served engine; shut down on exit, a failed start included."""
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    engine = AsyncEngine.open(EngineConfig(model=str(model_dir), **config))
    try:
        app = create_app(engine, ServedModel.from_engine(engine, str(model_dir)), api_key=api_key)
        server = BackgroundServer(app)
        server.engine = engine
        with server:
            yield server
    finally:
        engine.shutdown()


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free now (all held until all are chosen)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


class RouterExited(RuntimeError):
    """The router process ended before it was ready (its log says why)."""


class RouterProcess:
    """A router binary on a free port, its output in `log_path`."""

    def __init__(self, command: list[str], port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        with log_path.open("w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return strip_colours(self.log_path.read_text(errors="replace"))

    def wait_ready(self, ready, timeout_s: float = 120.0) -> None:
        """Poll `ready(url)` until true; fail with the log if the router died or never got there."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RouterExited(f"the router exited ({self.process.returncode}):\n{self.log()}")
            try:
                if ready(self.url):
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the router was not ready in {timeout_s:g} s:\n{self.log()}")
            time.sleep(0.25)

    def stop(self) -> None:
        """By PID: terminate, then kill if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def strip_colours(text: str) -> str:
    return _COLOUR.sub("", text)


_SAMPLE = re.compile(r'^resident_http_requests_total\{route="([^"]*)",status="(\d+)"\} (\S+)$')


def http_counts(url: str, api_key: str | None = None) -> dict[tuple[str, str], int]:
    """{(route, status): requests answered} from a replica's /metrics."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    text = httpx.get(url + "/metrics", headers=headers, timeout=30).text
    counts = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            counts[(match.group(1), match.group(2))] = int(float(match.group(3)))
    return counts
