"""The TUI's pieces that need no screen: diff parsing, approval previews, the status line,
and the shared command helpers (agent/core/commands.py) the REPL uses too."""

from __future__ import annotations

import difflib

from agent.core.approval_preview import CommandPreview, DiffPreview, preview
from agent.core.commands import SessionApprovals, undo_summary
from agent.core.engine_facts import EngineFacts
from agent.core.events import ContextSnapshot, SessionStarted, TextDelta, TurnStarted, Usage
from agent.core.tool_runner import ApprovalRequest
from agent.tui.widgets.diff_block import parse_unified_diff
from agent.tui.widgets.status_bar import StatusBar, meter
from tools import Checkpoint, RestoreReport


def changed_lines(before: list[str], after: list[str]) -> list[tuple[str, int, int]]:
    """(tag, first line before, first line after), 1-based, as the diff view numbers them."""
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    return [(t, i1 + 1, j1 + 1) for t, i1, _, j1, _ in matcher.get_opcodes() if t != "equal"]


def test_a_git_diff_is_laid_back_with_real_line_numbers():
    old = [f"line {n}" for n in range(1, 81)]
    new = list(old)
    new[9] = "line ten"  # line 10
    new.insert(60, "inserted")  # after line 60
    patch = "".join(
        difflib.unified_diff(
            [x + "\n" for x in old], [x + "\n" for x in new], "a/big.txt", "b/big.txt"
        )
    )
    git = (
        "diff --git a/big.txt b/big.txt\nindex 1..2 100644\n"
        + patch
        + "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n"
        "@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
        "diff --git a/logo.png b/logo.png\nBinary files a/logo.png and b/logo.png differ\n"
    )
    big, created, binary = parse_unified_diff(git)
    assert big.path == "big.txt" and created.path == "new.py" and binary.path == "logo.png"
    assert changed_lines(big.before, big.after) == [("replace", 10, 10), ("insert", 61, 61)]
    assert big.before[9] == "line 10" and big.after[60] == "inserted"
    assert created.before == [] and created.after == ["x = 1", "y = 2"]
    assert binary.note == "binary file"


def test_a_cut_diff_says_so_and_text_that_is_not_a_diff_gives_nothing():
    cut = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n… [diff truncated; 9,999 chars in all]\n"
    [file] = parse_unified_diff(cut)
    assert file.before == ["a", "b"] and file.note.startswith("diff truncated")
    assert parse_unified_diff("(no differences)") == []


def request(tool: str, **arguments) -> ApprovalRequest:
    return ApprovalRequest("call_1", tool, f"{tool} something", "ask mode asks", arguments)


def test_previews_show_the_whole_change_and_never_leave_the_workspace(tmp_path):
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    edit = preview(
        request("edit", path="calc.py", old_string="a - b", new_string="a + b"), tmp_path
    )
    assert edit == DiffPreview(
        "calc.py", "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n"
    )
    outside = tmp_path.parent / "secret.txt"
    outside.write_text("a - b")
    escape = preview(
        request("edit", path="../secret.txt", old_string="a - b", new_string="x"), tmp_path
    )
    assert escape == DiffPreview("../secret.txt", "a - b", "x")  # only what the model sent
    created = preview(request("write", path="new.py", content="x = 1\n"), tmp_path)
    assert created == DiffPreview("new.py", "", "x = 1\n")
    shell = preview(request("shell", command="pytest -q", workdir="tests"), tmp_path)
    assert shell == CommandPreview("pytest -q", "tests")
    assert preview(request("git_commit", message="m"), tmp_path) is None


def test_session_approvals_and_undo_summaries():
    approvals = SessionApprovals()
    asked = request("edit", path="calc.py")
    assert not approvals.allows(asked)
    approvals.remember(asked)
    assert approvals.allows(asked)
    assert not approvals.allows(request("shell", command="rm -rf /"))
    approvals.clear()
    assert not approvals.allows(asked)
    assert undo_summary(None) == ["Nothing to undo in this session."]
    report = RestoreReport(
        Checkpoint("cp1", "before edit", 0.0), written=("calc.py",), problems=("x.bin too big",)
    )
    assert undo_summary(report) == [
        "Undone: back to checkpoint cp1, 1 file restored.",
        "restored calc.py",
        "warning: x.bin too big",
    ]


def test_the_status_line_comes_from_events_and_drops_the_least_first():
    times = iter([10.0, 12.0])
    bar = StatusBar(clock=lambda: next(times))
    bar.set_engine(EngineFacts("glm-4.6", "http://gpu:8000", "fp8_e4m3"))
    bar.on_agent_event(
        SessionStarted(
            session_id="s", model="m", workspace="/w", approval="ask", context_window=100_000
        )
    )
    bar.on_agent_event(ContextSnapshot(epoch=1, files=3, tokens=40_000, mode="full"))
    bar.on_agent_event(TurnStarted(turn=1))
    bar.on_agent_event(TextDelta(text="Hel"))
    bar.on_agent_event(TextDelta(text="lo"))  # the clock is read at the first delta only
    bar.on_agent_event(
        Usage(
            prompt_tokens=50_000,
            completion_tokens=101,
            cached_tokens=40_000,
            resident_tokens=40_000,
            context_window=100_000,
        )
    )
    full = str(bar.summary())
    assert "glm-4.6 · gpu:8000 · KV fp8_e4m3" in full
    assert "40.0k/100.0k res" in full and "prompt 50.0k" in full
    assert "cache 80%" in full and "50.0 tok/s" in full and full.endswith("ask")
    narrow = str(bar.summary(width=60))
    assert len(narrow) <= 60 and "glm-4.6" in narrow and "ask" not in narrow
    assert str(meter(40, 50, 100, cells=10)) == "████" + "█" + "░" * 5
