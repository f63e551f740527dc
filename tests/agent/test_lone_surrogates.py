"""A model that writes lone UTF-16 surrogates (`"\\ud800"` in a stream's JSON) in its
text, its reasoning and its tool arguments: every event, journal line and later
request stays writable, with U+FFFD in their place (agent/core/valid_unicode.py)."""

from __future__ import annotations

import asyncio
import json
import re

from agent.core.clients import (
    ChatRequest,
    Completion,
    ContentDelta,
    HTTPClient,
    ReasoningDelta,
    ToolCall,
    ToolCallError,
    valid_stream,
)
from agent.core.events import SessionStarted, ToolResultEvent, parse_event
from agent.core.session import SessionStore
from agent.core.valid_unicode import (
    json_text,
    model_json,
    valid_arguments,
    valid_json,
    valid_text,
)
from tests.agent.helpers import attached, run_cli
from tests.agent.scripted_server import Reply, ScriptedServer

BAD = "\ufffd"
SURROGATE = re.compile("[\ud800-\udfff]")
# Escaped in JSON text: what a server sends for a lone surrogate.
ESCAPED = re.compile(r"\\u[dD][89a-fA-F]")


def hostile_script() -> list[Reply]:
    return [
        Reply(
            # Seven characters a chunk: the pair of U+1F600 is split across two chunks.
            "abcdef\ud83d\ude00 then a lone \ud800 here",
            [
                ("read", '{"path": "notes\ud800.txt"}'),  # written out in the arguments
                ("read", '{"path": "calc\\udcff.py"}'),  # escaped in the arguments' JSON
            ],
            reasoning="thinking \udfff",
        ),
        Reply("Done \udc00."),
    ]


def test_run_json_survives_lone_surrogates_and_continue_reads_the_journal(repo):
    with ScriptedServer(hostile_script()) as server:
        first = run_cli("look \ud800", *attached(server.url))
    assert first.exit_code == 0, first.stderr
    assert ESCAPED.search(first.stdout) is None and SURROGATE.search(first.stdout) is None
    seqs = [event["seq"] for event in first.events]
    assert seqs == list(range(1, len(seqs) + 1))  # no event was lost to a failing sink
    assert first.of_type("user_message")[0]["text"] == f"look {BAD}"
    text = "".join(event["text"] for event in first.of_type("text_delta"))
    assert text == f"abcdef\U0001f600 then a lone {BAD} here" + f"Done {BAD}."
    reasoning = "".join(event["text"] for event in first.of_type("reasoning_delta"))
    assert reasoning == f"thinking {BAD}"
    paths = [json.loads(call["arguments"])["path"] for call in first.of_type("tool_call")]
    assert paths == [f"notes{BAD}.txt", f"calc{BAD}.py"]
    assert len(first.of_type("tool_result")) == 2
    assert first.final["exit_code"] == 0 and first.final["final_message"] == f"Done {BAD}."
    # The second request carried the history back: valid Unicode, U+FFFD in place.
    history = server.requests[1]["messages"]
    assert history[1] == {"role": "user", "content": f"look {BAD}"}
    assert not SURROGATE.search(json.dumps(history, ensure_ascii=False))

    session_id = first.of_type("session_started")[0]["session_id"]
    session = SessionStore().open(session_id)
    assert [event.seq for event in session.load_events()] == seqs  # every line journaled
    with ScriptedServer([Reply("Again.")]) as server:
        second = run_cli("again", *attached(server.url, "--continue"))
    assert second.exit_code == 0, second.stderr
    assert second.of_type("session_started")[0]["session_id"] == session_id
    conversation = server.requests[0]["messages"][1:]
    assert conversation[0] == {"role": "user", "content": f"look {BAD}"}
    assert conversation[1]["content"] == f"abcdef\U0001f600 then a lone {BAD} here"
    arguments = [c["function"]["arguments"] for c in conversation[1]["tool_calls"]]
    assert [json.loads(a)["path"] for a in arguments] == [f"notes{BAD}.txt", f"calc{BAD}.py"]
    assert conversation[-2] == {"role": "assistant", "content": f"Done {BAD}."}
    assert conversation[-1] == {"role": "user", "content": "again"}


# -- the pieces --------------------------------------------------------------------------


def test_valid_text_replaces_lone_surrogates_and_joins_pairs():
    clean = "plain text, caf\u00e9, \U0001f600"
    assert valid_text(clean) is clean
    assert valid_text("a\ud800b") == f"a{BAD}b"
    assert valid_text("\udc00\ud800") == BAD * 2  # a low one before a high one: no pair
    assert valid_text("x\ud83d\ude00y") == "x\U0001f600y"
    assert valid_text("\ud83d") == BAD
    value = {"k\udcff": ["\ud800", 1, None, {"ok": "fine"}]}
    assert valid_json(value) == {f"k{BAD}": [BAD, 1, None, {"ok": "fine"}]}
    unchanged = {"a": ["b", {"c": "d"}]}
    assert valid_json(unchanged) is unchanged


def test_valid_arguments_mend_escaped_and_written_out_surrogates():
    assert json.loads(valid_arguments('{"path": "a\\ud800"}')) == {"path": f"a{BAD}"}
    assert json.loads(valid_arguments('{"path": "a\ud800"}')) == {"path": f"a{BAD}"}
    for kept in (
        '{"path": "a\\ud83d\\ude00"}',  # an escaped pair is one character
        '{"path": "C:\\\\ud800"}',  # an escaped backslash, then text
        '{"path": "a\\ud800"',  # not JSON: refused as malformed later, escapes kept
        '{"path":   "spacing kept"}',
    ):
        assert valid_arguments(kept) == kept


def test_json_writers_take_a_lone_surrogate():
    event = ToolResultEvent(id="c", ok=True, output="name-\udcff.txt", data={"k": "\ud800"})
    line = model_json(event)
    line.encode("utf-8")
    assert parse_event(line) == ToolResultEvent(
        id="c", ok=True, output=f"name-{BAD}.txt", data={"k": BAD}
    )
    clean = SessionStarted(
        session_id="s", model="m", workspace="/w", approval="ask", context_window=1
    )
    assert model_json(clean) == clean.model_dump_json()
    assert json.loads(json_text({"a\ud800": "b\udfff"})) == {f"a{BAD}": f"b{BAD}"}


def test_journals_keep_every_line(tmp_path):
    store = SessionStore(tmp_path)
    session = store.create(tmp_path, "model", title="title \ud800")
    session.journal(ToolResultEvent(id="c", ok=True, output="name-\udcff.txt"))
    session.append_messages([{"role": "tool", "tool_call_id": "c", "content": "x\udcff"}])
    session.close()
    reopened = store.open(session.id)
    assert [e.output for e in reopened.load_events()] == [f"name-{BAD}.txt"]
    assert reopened.load_messages() == [{"role": "tool", "tool_call_id": "c", "content": f"x{BAD}"}]
    assert reopened.meta.title == f"title {BAD}"


async def _items(*items):
    for item in items:
        yield item


def _collect(*items) -> list:
    async def run() -> list:
        return [item async for item in valid_stream(_items(*items))]

    return asyncio.run(run())


def test_valid_stream_mends_every_kind_of_item():
    got = _collect(
        ReasoningDelta("think \ud83d"),
        ReasoningDelta("\ude00"),
        ContentDelta("high at the end \ud800"),
        ToolCall(id="c\ud800", name="read\udfff", arguments_json='{"path": "\\udfff"}'),
        ToolCallError("bad \ud800 markup"),
        ContentDelta("lone \ud800"),
        Completion(finish_reason="stop\ud800"),
    )
    assert got == [
        ReasoningDelta("think "),
        ReasoningDelta("\U0001f600"),
        ContentDelta("high at the end "),
        ContentDelta(BAD),  # held back for a low surrogate that never came
        ToolCall(id=f"c{BAD}", name=f"read{BAD}", arguments_json=f'{{"path": "{BAD}"}}'),
        ToolCallError(f"bad {BAD} markup"),
        ContentDelta("lone "),
        ContentDelta(BAD),
        Completion(finish_reason=f"stop{BAD}"),
    ]
    clean = ContentDelta("fine")
    assert _collect(clean)[0] is clean


def test_a_request_body_is_valid_unicode():
    """History that holds a lone surrogate some other way (a file name that is not
    UTF-8) still goes out, with U+FFFD in its place."""
    with ScriptedServer([Reply("ok")]) as server:

        async def ask() -> None:
            client = HTTPClient(server.url, context_window=4096)
            request = ChatRequest(messages=[{"role": "user", "content": "file-\udcff.txt"}])
            try:
                async for _ in client.stream(request):
                    pass
            finally:
                await client.aclose()

        asyncio.run(ask())
    assert server.requests[0]["messages"] == [{"role": "user", "content": f"file-{BAD}.txt"}]
