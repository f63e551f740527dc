"""Driving the TUI in tests: an app on the scripted server, waiting, reading the screen."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rich.console import Console
from textual.pilot import Pilot

from agent.core.runtime import RuntimeOptions
from agent.tui import ResidentApp
from tests.agent.scripted_server import ScriptedServer


def make_app(url: str, workspace: Path, tmp: Path, **options: Any) -> ResidentApp:
    runtime = RuntimeOptions(workspace=workspace, attach=url, context_window=32768, **options)
    return ResidentApp(runtime, history_path=tmp / "history.jsonl", retry_delays=(0.05,))


async def wait_until(
    pilot: Pilot, condition: Callable[[], Any], what: str = "", timeout: float = 15.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await pilot.pause(0.02)


async def ready(pilot: Pilot) -> ResidentApp:
    app = pilot.app
    assert isinstance(app, ResidentApp)
    await wait_until(pilot, lambda: app.ready, "the agent to start")
    return app


async def send(pilot: Pilot, text: str) -> None:
    """Put a message in the input box and press Enter (typing itself: test_input.py)."""
    app = pilot.app
    assert isinstance(app, ResidentApp)
    app.prompt.focus()
    app.prompt.load_text(text)
    app.prompt.move_cursor(app.prompt.document.end)
    await pilot.pause()
    app.prompt.menu.close()
    await pilot.press("enter")


async def settle(pilot: Pilot) -> None:
    """Until the agent is idle and the screen has caught up."""
    app = pilot.app
    assert isinstance(app, ResidentApp)
    await wait_until(pilot, lambda: not app.busy, "the agent to finish")
    await pilot.pause(0.1)


def screen_text(app: ResidentApp) -> str:
    """The screen as plain text, as a person would read it."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text(styles=False)


async def shows(pilot: Pilot, *texts: str) -> None:
    """Until every one of `texts` is on the screen."""
    app = pilot.app
    assert isinstance(app, ResidentApp)
    for text in texts:
        await wait_until(pilot, lambda text=text: text in screen_text(app), f"{text!r} on screen")


class RestartableServer(ScriptedServer):
    """A scripted server that can go away and come back on the same port."""

    def __init__(self, script: list[Any], port: int = 0, **kwargs: Any) -> None:
        super().__init__(script, **kwargs)
        if port:
            self._httpd.server_close()
            self._httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
            self._httpd.daemon_threads = True
            self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]
