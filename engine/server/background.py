"""Run an app under uvicorn on a free loopback port in a background thread.

For benchmarks and tests that need a real HTTP server in the same process
(so they can also read the engine directly).
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from engine.server.app import KEEP_ALIVE_SECONDS


class BackgroundServer:
    def __init__(self, app, log_level: str = "warning") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level=log_level, lifespan="off", timeout_keep_alive=KEEP_ALIVE_SECONDS
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *_) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()
