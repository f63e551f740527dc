"""Attached mode: a server that is not there, or goes away, shows a banner and is retried."""

from __future__ import annotations

import pytest

from agent.core.clients import http
from agent.tui.widgets.banner import ConnectionBanner
from agent.tui.widgets.notes import ErrorNote
from tests.agent.scripted_server import Reply
from tests.agent.tui.helpers import (
    RestartableServer,
    make_app,
    ready,
    send,
    settle,
    shows,
    wait_until,
)

pytestmark = pytest.mark.anyio


async def test_lost_connection_shows_a_banner_and_comes_back(repo, tmp_path, monkeypatch):
    monkeypatch.setattr(http, "DEFAULT_RETRY", http.RetryPolicy(attempts=2, base_delay_s=0.01))
    reserved = RestartableServer([])
    port = reserved.port
    reserved._httpd.server_close()  # nothing listens there yet
    url = f"http://127.0.0.1:{port}"
    app = make_app(url, repo, tmp_path)
    async with app.run_test(size=(110, 40)) as pilot:
        banner = app.query_one(ConnectionBanner)
        await wait_until(pilot, lambda: banner.lost, "the banner at startup")
        await shows(pilot, f"Cannot reach {url}. Checking again")
        assert not app.ready
        with RestartableServer([Reply("First.")], port=port):
            await ready(pilot)
            assert not banner.lost and "again" in banner.text
            await send(pilot, "hello")
            await settle(pilot)
            await shows(pilot, "First.")
        # The server goes away in the middle of the session.
        await send(pilot, "still there?")
        await settle(pilot)
        await wait_until(pilot, lambda: banner.lost, "the banner after a failed request")
        [error] = app.query(ErrorNote)
        assert error.kind == "transient" and "send the message again" in error.next_step
        with RestartableServer([Reply("Back again.")], port=port) as server:
            await wait_until(pilot, lambda: not banner.lost, "the reconnection")
            await send(pilot, "still there?")
            await settle(pilot)
            await shows(pilot, "Back again.")
            assert server.requests[0]["messages"][-1]["content"] == "still there?"
