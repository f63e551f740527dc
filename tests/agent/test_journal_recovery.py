"""Journals after a kill: a real process dies mid-append at a chosen byte (inside a
UTF-8 character, or not), and the next `resident run --continue` reads what is whole,
warns once, cuts the torn bytes off and appends its own turn where it can be read."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.core import journal
from agent.core.session import SessionStore
from agent.tui.prompt_history import PromptHistory
from tests.agent.helpers import attached, run_cli
from tests.agent.scripted_server import Reply, ScriptedServer

ROOT = Path(__file__).resolve().parents[2]

# Appends one more record to a session's journal and is killed by the kernel (SIGXFSZ,
# its default action put back: Python ignores it) when the file reaches a size chosen
# so that the record stops one byte into "é", or inside its ASCII start.
TEAR = """
import resource, signal, sys
from agent.core.events import TextDelta, TurnCompleted
from agent.core.session import SessionStore
session_id, target, where = sys.argv[1:4]
session = SessionStore().open(session_id)
if target == "messages":
    path = session.dir / "messages.jsonl"
    line = '{"op": "append", "messages": [{"role": "user", "content": "torn é"}]}'
else:
    path = session.dir / "events.jsonl"
    line = TextDelta(text="torn é", seq=999).model_dump_json()
encoded = line.encode()
cut = encoded.index("é".encode()) + 1 if where == "mid-char" else 5
limit = path.stat().st_size + cut
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
if target == "messages":
    session.append_messages([{"role": "user", "content": "torn é"}])
else:
    session.journal(TextDelta(text="torn é", seq=999))
    session.journal(TurnCompleted(turn=9, finish_reason="stop", seq=1000))  # syncs: dies
print("not killed")
"""


def tear(session_id: str, target: str, where: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", TEAR, session_id, target, where],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGXFSZ, child.stdout + child.stderr


@pytest.mark.parametrize("target", ["messages", "events"])
@pytest.mark.parametrize("where", ["mid-char", "ascii"])
def test_continue_after_a_kill_mid_append(repo, caplog, target, where):
    with ScriptedServer([Reply("First answer.")]) as server:
        first = run_cli("first question", *attached(server.url))
    session_id = first.of_type("session_started")[0]["session_id"]
    tear(session_id, target, where)
    path = SessionStore().open(session_id).dir / f"{target}.jsonl"
    assert not path.read_bytes().endswith(b"\n")  # the kill left a torn line

    with caplog.at_level(logging.WARNING, logger="agent.core.journal"):
        with ScriptedServer([Reply("Second answer.")]) as server:
            second = run_cli("second question", *attached(server.url, "--continue"))
    assert second.exit_code == 0, second.stderr
    assert second.of_type("session_started")[0]["resumed"] is True
    torn = [r for r in caplog.records if "torn by an interrupted write" in r.getMessage()]
    assert len(torn) == 1  # reported once, however often the file was read and appended
    assert path.read_bytes().endswith(b"\n")

    # The second turn was appended where it can be read back: a third run sees it all.
    with ScriptedServer([Reply("Third answer.")]) as server:
        third = run_cli("third question", *attached(server.url, "--continue"))
    assert third.exit_code == 0, third.stderr
    assert server.requests[0]["messages"][1:] == [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "Second answer."},
        {"role": "user", "content": "third question"},
    ]
    events = SessionStore().open(session_id).load_events()
    starts = [e for e in events if e.type == "session_started"]
    assert len(starts) == 3  # the continuation's first event was not glued to the torn bytes
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs)


def test_a_whole_last_record_missing_only_its_newline_is_kept(tmp_path, caplog):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}')
    assert journal.read_records(path) == [{"a": 1}, {"b": 2}]
    with journal.open_for_append(path) as handle:
        handle.write('{"c": 3}\n')
    assert journal.read_records(path) == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert not caplog.records


def test_unreadable_lines_never_stop_a_read(tmp_path):
    path = tmp_path / "log.jsonl"
    deep = b"[" * 100_000 + b"]" * 100_000  # json.loads gives RecursionError
    path.write_bytes(b'{"a": 1}\n\xff\xfe\n' + deep + b'\n{"b": 2}\n{"c": "\xc3')
    assert journal.read_records(path) == [{"a": 1}, {"b": 2}]
    assert journal.repair_tail(path) == len(b'{"c": "\xc3')
    assert path.read_bytes().endswith(b'{"b": 2}\n')


def test_prompt_history_survives_a_torn_utf8_tail(tmp_path):
    path = tmp_path / "prompt_history.jsonl"
    path.write_bytes(b'"first"\n"caf\xc3')  # killed one byte into "é"
    history = PromptHistory(path)
    assert history.entries == ["first"]
    history.add("second")
    assert PromptHistory(path).entries == ["first", "second"]
    assert json.loads(path.read_bytes().splitlines()[-1]) == "second"
