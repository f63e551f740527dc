"""Events as pydantic models, and sessions on disk surviving a kill."""

from __future__ import annotations

import typing

from agent.core.events import (
    AnyEvent,
    EventEmitter,
    SessionCompleted,
    TextDelta,
    ToolCallEvent,
    TurnCompleted,
    parse_event,
)
from agent.core.session import SessionStore


def test_every_event_type_is_distinct_and_round_trips():
    members = typing.get_args(typing.get_args(AnyEvent)[0])
    names = [m.model_fields["type"].default for m in members]
    assert len(names) == len(set(names))
    for required in (
        "session_started turn_started text_delta reasoning_delta tool_call approval_requested "
        "approval_resolved tool_result usage context_snapshot error turn_completed session_completed"
    ).split():
        assert required in names
    event = ToolCallEvent(id="c", name="read", arguments="{}")
    assert parse_event(event.model_dump_json()) == event


def test_emitter_numbers_events_and_survives_a_broken_sink():
    seen = []

    def broken(event):
        raise RuntimeError("display died")

    emitter = EventEmitter([broken, seen.append], next_seq=5)
    emitter.emit(TextDelta(text="a"))
    emitter.emit(TextDelta(text="b"))
    assert [e.seq for e in seen] == [5, 6]


def test_a_killed_process_loses_at_most_the_partial_turn(tmp_path):
    store = SessionStore(tmp_path)
    session = store.create(tmp_path, "m", title="a  task\nwith lines")
    emitter = EventEmitter([session.journal])
    session.append_messages([{"role": "user", "content": "q"}])
    emitter.emit(TextDelta(text="answer"))
    session.append_messages([{"role": "assistant", "content": "answer"}])
    emitter.emit(TurnCompleted(turn=1, finish_reason="stop"))
    emitter.emit(TextDelta(text="partial"))  # journaled, not yet synced; then "killed"
    with (session.dir / "events.jsonl").open("a") as handle:
        handle.write('{"type": "text_del')  # a torn line
    reopened = store.open(session.id[:12])  # a unique prefix is enough
    assert reopened.load_messages() == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "answer"},
    ]
    assert [e.type for e in reopened.load_events()][:2] == ["text_delta", "turn_completed"]
    assert reopened.meta.title == "a task with lines"


def test_reset_replaces_the_conversation_and_latest_finds_it(tmp_path):
    store = SessionStore(tmp_path)
    old = store.create(tmp_path / "a", "m")
    old.append_messages([{"role": "user", "content": "1"}])
    old.reset_messages([{"role": "user", "content": "summary"}])
    old.journal(SessionCompleted(final_message="", exit_code=0))
    assert store.open(old.id).load_messages() == [{"role": "user", "content": "summary"}]
    assert store.latest(tmp_path / "a").id == old.id
    assert store.latest(tmp_path / "b") is None
