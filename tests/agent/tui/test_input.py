"""The input box: Enter sends, ctrl+j adds a line, history, and completion of commands and paths."""

from __future__ import annotations

import pytest

from agent.tui.completion import complete, rank_paths
from agent.tui.prompt_history import PromptHistory
from agent.tui.widgets.user_block import UserBlock
from tests.agent.scripted_server import Reply, ScriptedServer
from tests.agent.tui.helpers import make_app, ready, settle, wait_until

pytestmark = pytest.mark.anyio


def test_completion_offers_commands_modes_and_paths():
    commands = complete("/c", first_line=True, files=[])
    assert commands is not None
    assert [i.label for i in commands.items] == ["/context", "/compact", "/clear"]
    assert complete("/quit", first_line=True, files=[]) is None  # nothing left to add
    assert complete("/c", first_line=False, files=[]) is None  # only at the start
    modes = complete("/approval a", first_line=True, files=[])
    assert modes is not None and modes.start == len("/approval ")
    assert [i.insert for i in modes.items] == ["ask", "auto-edit"]
    files = ["README.md", "agent/calc.py", "calc.py", "tests/test_calc.py"]
    paths = complete("look at @cal", first_line=True, files=files)
    assert paths is not None and paths.start == len("look at ")
    assert [i.insert for i in paths.items] == [
        "@calc.py ",
        "@agent/calc.py ",
        "@tests/test_calc.py ",
    ]
    assert complete("mail me@example", first_line=True, files=files) is None
    assert rank_paths("test", files) == ["tests/test_calc.py"]


def test_history_walks_back_and_forth_and_persists(tmp_path):
    path = tmp_path / "history.jsonl"
    history = PromptHistory(path)
    for text in ("one", "two", "two", "three"):
        history.add(text)
    assert history.previous("draft") == "three"
    assert history.previous("") == "two"
    assert history.previous("") == "one"
    assert history.previous("") is None
    assert history.next() == "two"
    assert history.next() == "three"
    assert history.next() == "draft"  # back to what was being written
    assert history.next() is None
    assert PromptHistory(path).entries == ["one", "two", "three"]


async def test_typing_completing_newlines_and_history(repo, tmp_path):
    with ScriptedServer([Reply("Got it."), Reply("Again.")]) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            prompt = app.prompt
            await wait_until(pilot, lambda: "calc.py" in prompt.files, "the file list")
            await pilot.press(*"fix @cal")
            assert prompt.menu.is_open
            await pilot.press("tab")
            assert prompt.text == "fix @calc.py "
            await pilot.press("ctrl+j", *"please")
            assert prompt.text == "fix @calc.py \nplease"
            await pilot.press("enter")
            await settle(pilot)
            assert [u.text for u in app.query(UserBlock)] == ["fix @calc.py \nplease".strip()]
            assert prompt.text == ""
            assert server.requests[0]["messages"][-1]["content"] == "fix @calc.py \nplease".strip()
            await pilot.press("up")
            assert prompt.text == "fix @calc.py \nplease".strip()
            await pilot.press("down", "down")
            assert prompt.text == ""
            await pilot.press(*"/he")
            assert [i.label for i in prompt.menu.completions.items] == ["/help"]
            await pilot.press("enter")  # takes the completion
            assert prompt.text == "/help"
            await pilot.press("enter")  # sends it
            await wait_until(pilot, lambda: app.query("Markdown.help"), "the help")
            assert "/sessions" in app.query_one("Markdown.help").source
