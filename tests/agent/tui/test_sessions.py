"""Resuming sessions in the TUI, and staying responsive in a long one."""

from __future__ import annotations

import pytest

from agent.core.events import EventEmitter, SessionStarted, TextDelta, TurnCompleted, TurnStarted
from agent.core.events import UserMessage as UserMessageEvent
from agent.core.session import SessionStore
from agent.tui.screens.sessions import SessionsScreen
from agent.tui.widgets.assistant import AssistantBlock
from agent.tui.widgets.conversation import KEEP_GROUPS, TaskGroup
from agent.tui.widgets.user_block import UserBlock
from tests.agent.scripted_server import Reply, ScriptedServer
from tests.agent.tui.helpers import make_app, ready, send, settle, shows, wait_until

pytestmark = pytest.mark.anyio


async def test_sessions_lists_and_resumes_an_earlier_session(repo, tmp_path):
    with ScriptedServer([Reply("First."), Reply("Welcome back.")]) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "hello")
            await settle(pilot)
            first_id = app.bridge.session_id()
            await send(pilot, "/clear")
            await wait_until(pilot, lambda: app.bridge.session_id() != first_id, "a new session")
            await wait_until(pilot, lambda: not app.query(UserBlock), "an empty conversation")
            await send(pilot, "/sessions")
            await wait_until(pilot, lambda: isinstance(app.screen, SessionsScreen), "the list")
            ids = [meta.id for meta in app.screen.sessions]
            assert first_id in ids and len(ids) == 2
            for _ in range(ids.index(first_id)):
                await pilot.press("down")
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.bridge.session_id() == first_id, "the resume")
            await wait_until(pilot, lambda: app.query(UserBlock), "the history")
            assert [u.text for u in app.query(UserBlock)] == ["hello"]
            assert [a.text for a in app.query(AssistantBlock)] == ["First."]
            await send(pilot, "and again")
            await settle(pilot)
            await shows(pilot, "Welcome back.")
    users = [m["content"] for m in server.requests[1]["messages"] if m["role"] == "user"]
    assert users == ["hello", "and again"]


def long_session(workspace, exchanges: int) -> str:
    """A session on disk with `exchanges` questions and answers (2 messages each)."""
    session = SessionStore().create(workspace, "scripted-model", title="long")
    emitter = EventEmitter([session.journal])
    emitter.emit(
        SessionStarted(
            session_id=session.id,
            model="scripted-model",
            workspace=str(workspace),
            approval="ask",
            context_window=32768,
        )
    )
    messages = []
    for i in range(exchanges):
        emitter.emit(UserMessageEvent(text=f"question {i}"))
        emitter.emit(TurnStarted(turn=1))
        for piece in (f"answer **{i}**", " with", " several", " pieces."):
            emitter.emit(TextDelta(text=piece))
        emitter.emit(TurnCompleted(turn=1, finish_reason="stop"))
        messages += [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": f"answer **{i}** with several pieces."},
        ]
    session.append_messages(messages)
    session.close()
    return session.id


async def test_a_thousand_message_session_resumes_and_stays_responsive(repo, tmp_path):
    session_id = long_session(repo, 500)
    with ScriptedServer([Reply("Still with you.")]) as server:
        app = make_app(server.url, repo, tmp_path, resume=session_id)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            view = app.conversation
            groups = view.groups
            assert len(groups) <= KEEP_GROUPS + 1  # the latest tasks, plus this start
            assert view.hidden_count >= 500 - KEEP_GROUPS
            users = [u.text for u in app.query(UserBlock)]
            assert users[-1] == "question 499"
            assert app.query(AssistantBlock).last().text == "answer **499** with several pieces."
            # Keys still reach the input box at once.
            app.prompt.focus()
            await pilot.press("o", "k")
            assert app.prompt.text == "ok"
            app.prompt.clear()
            before = len(view.query_children(TaskGroup))
            await pilot.press("ctrl+up")  # earlier tasks come back on demand
            await wait_until(pilot, lambda: len(view.query_children(TaskGroup)) > before)
            number = int(app.query(UserBlock).first().text.split()[-1])
            assert number < int(users[0].split()[-1])
            await send(pilot, "are you there?")
            await settle(pilot)
            await shows(pilot, "Still with you.")
    assert len(server.requests[0]["messages"]) == 1 + 1000 + 1  # system, history, new
