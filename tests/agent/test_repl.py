"""`resident` with no subcommand: the agent line by line, against the scripted server."""

from __future__ import annotations

import io
import signal
import threading

from typer.testing import CliRunner

from agent.cli import app
from agent.core.runtime import RuntimeOptions
from agent.repl import Repl
from tests.agent.scripted_server import Reply, ScriptedServer, call, wait_for, wait_until

EDIT = call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")


def repl(url: str, input: str, *extra: str):
    args = ["--attach", url, "--context-window", "32768", *extra]
    return CliRunner().invoke(app, args, input=input, catch_exceptions=False)


def edit_script(last: str) -> list[Reply]:
    return [Reply("I will fix it.", [EDIT]), Reply(last)]


def test_approved_edit_changes_the_file(repo):
    with ScriptedServer(edit_script("Fixed add."), publish_stats=False) as server:
        result = repl(server.url, "fix add\ny\n/quit\n")
    assert result.exit_code == 0, result.output
    assert "return a + b" in (repo / "calc.py").read_text()
    out = result.output
    assert "I will fix it." in out and "Fixed add." in out  # streamed text
    assert "→ edit(" in out and "needs approval" in out and "allow?" in out
    assert "✓" in out
    tool_message = server.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool"
    assert server.requests[0]["messages"][-1] == {"role": "user", "content": "fix add"}


def test_denied_edit_tells_the_model_and_leaves_the_file(repo):
    with ScriptedServer(edit_script("Understood.")) as server:
        result = repl(server.url, "fix add\nn use the test first\n/quit\n")
    assert result.exit_code == 0, result.output
    assert "return a - b" in (repo / "calc.py").read_text()
    assert "✗" in result.output and "Understood." in result.output
    tool_message = server.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool"
    assert "denied" in tool_message["content"] and "use the test first" in tool_message["content"]


def test_allow_for_the_session_is_not_asked_again(repo):
    second = call("edit", path="calc.py", old_string="return a + b", new_string="return b + a")
    script = [Reply("", [EDIT]), Reply("Once."), Reply("", [second]), Reply("Twice.")]
    with ScriptedServer(script) as server:
        # `a` allows editing calc.py for the session: the second edit is not asked.
        result = repl(server.url, "fix add\na\nswap\n/quit\n")
    assert result.exit_code == 0, result.output
    assert "return b + a" in (repo / "calc.py").read_text()
    assert result.output.count("allow?") == 1
    assert len(server.requests) == 4


def test_lines_continue_one_session(repo):
    with ScriptedServer([Reply("First."), Reply("Second.")]) as server:
        result = repl(server.url, "hello\nand again\n/quit\n")
    assert result.exit_code == 0, result.output
    second = server.requests[1]["messages"]
    assert [m["content"] for m in second if m["role"] == "user"][-2:] == ["hello", "and again"]
    assert {"role": "assistant", "content": "First."} in second


def test_quit_exits_0(repo):
    with ScriptedServer([]) as server:
        result = repl(server.url, "/help\n/quit\n")
    assert result.exit_code == 0, result.output
    assert "/compact" in result.output and "/undo" in result.output
    assert server.requests == []


def test_ctrl_d_exits_0(repo):
    with ScriptedServer([]) as server:
        result = repl(server.url, "")
    assert result.exit_code == 0, result.output
    assert "session" in result.output


def test_undo_restores_the_file(repo):
    with ScriptedServer(edit_script("Done.")) as server:
        result = repl(server.url, "fix add\ny\n/undo\n/undo\n/quit\n")
    assert result.exit_code == 0, result.output
    assert "return a - b" in (repo / "calc.py").read_text()
    assert "[undone" in result.output and "nothing to undo" in result.output


def test_clear_starts_a_new_session(repo):
    with ScriptedServer([Reply("First."), Reply("Fresh.")]) as server:
        result = repl(server.url, "hello\n/clear\nagain\n/quit\n")
    assert result.exit_code == 0, result.output
    users = [m for m in server.requests[1]["messages"] if m["role"] == "user"]
    assert [m["content"] for m in users][-1] == "again"
    assert all(m["content"] != "hello" for m in users)
    assert result.output.count("started:") == 2


def test_unreachable_server_exits_75(repo, monkeypatch):
    from agent.core.clients import http

    monkeypatch.setattr(http, "DEFAULT_RETRY", http.RetryPolicy(base_delay_s=0.01))
    result = repl("http://127.0.0.1:9", "")
    assert result.exit_code == 75
    assert "Traceback" not in result.output


def test_bad_approval_mode_is_a_usage_error(repo):
    result = repl("http://127.0.0.1:9", "", "--approval", "sometimes")
    assert result.exit_code == 2


def scripted_lines(*lines):
    """A read_line that replays lines, then ends the input (Ctrl-D); an exception is raised."""
    pending = list(lines)

    def read_line(prompt: str) -> str:
        if not pending:
            raise EOFError
        item = pending.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    return read_line


def make_repl(url: str, *lines) -> tuple[Repl, io.StringIO]:
    out = io.StringIO()
    options = RuntimeOptions(attach=url, context_window=32768)
    return Repl(options, out=out, read_line=scripted_lines(*lines)), out


def test_ctrl_c_twice_at_the_prompt_quits(repo):
    with ScriptedServer([]) as server:
        repl_, out = make_repl(server.url, KeyboardInterrupt(), KeyboardInterrupt())
        assert repl_.run() == 0
    assert "Ctrl-C again" in out.getvalue()


def test_ctrl_c_interrupts_the_answer_and_the_session_goes_on(repo):
    script = [Reply("Thinking hard", stall=True), Reply("Still here.")]
    with ScriptedServer(script) as server:
        repl_, out = make_repl(server.url, "think", "are you there?", "/quit")

        def press_ctrl_c() -> None:
            # Press only once the whole streamed text is on screen, as a user would.
            wait_for(server.stalled)
            wait_until(lambda: "Thinking hard" in out.getvalue(), what="text never shown")
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

        presser = threading.Thread(target=press_ctrl_c, daemon=True)
        presser.start()
        assert repl_.run() == 0
        presser.join(5)
    text = out.getvalue()
    assert "Thinking hard" in text and "[interrupted]" in text and "Still here." in text
    second = server.requests[1]["messages"]
    assert any("[interrupted by the user]" in (m.get("content") or "") for m in second)
