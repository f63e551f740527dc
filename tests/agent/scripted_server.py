"""A scripted OpenAI-compatible server on loopback: real HTTP, replayed answers.

Each POST /v1/chat/completions takes the next step of the script: an
assistant answer streamed as SSE (text, reasoning, tool calls), an HTTP
error, garbage, a stream cut in the middle of a tool call, or an answer that
stalls until released (for interrupts). Every request body is recorded, so
tests can check what the agent sent, e.g. that each prompt extends the last.
Plain stdlib (http.server), so the tests need nothing beyond the project.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)  # (name, dict or raw str)
    reasoning: str = ""
    finish_reason: str | None = None
    stall: bool = False  # send the text, then wait for `release` before finishing


@dataclass
class Status:
    code: int
    body: str = '{"error": {"message": "overloaded", "type": "server_error"}}'
    retry_after: str | None = "0"


@dataclass
class Garbage:
    payload: str = "data: this is not json\n\n"


@dataclass
class CutMidToolCall:
    name: str = "read"


def call(name: str, **arguments: Any) -> tuple[str, Any]:
    return (name, arguments)


class ScriptedServer:
    def __init__(
        self,
        script: list[Any],
        *,
        stats: dict[str, Any] | None = None,
        publish_stats: bool = True,
        api_key: str | None = None,
        repeat_last: bool = False,
    ) -> None:
        self.script = list(script)
        self.stats = stats or {"max_context_tokens": 32768, "capacity_tokens": 65536}
        self.publish_stats = publish_stats
        self.api_key = api_key
        self.repeat_last = repeat_last
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []  # of each request, names lowercased
        self.release = threading.Event()
        self.stalled = threading.Event()
        self.aborted = threading.Event()  # the client went away during a stalled answer
        self._lock = threading.Lock()
        self._calls = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def next_step(self) -> tuple[Any, int]:
        with self._lock:
            self._calls += 1
            if not self.script:
                return Status(500, '{"error": {"message": "script exhausted"}}', None), self._calls
            if self.repeat_last and len(self.script) == 1:
                return self.script[0], self._calls
            return self.script.pop(0), self._calls

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection closes

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if server.api_key is None:
                    return True
                if self.headers.get("Authorization") == f"Bearer {server.api_key}":
                    return True
                self._json(401, {"error": {"message": "invalid API key"}})
                return False

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                if self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": "scripted-model"}]})
                elif self.path == "/v1/engine/stats" and server.publish_stats:
                    self._json(200, server.stats)
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self._authorized():
                    return
                server.requests.append(body)
                server.request_headers.append({k.lower(): v for k, v in self.headers.items()})
                step, number = server.next_step()
                if isinstance(step, Status):
                    headers = {"Retry-After": step.retry_after} if step.retry_after else {}
                    self._json(step.code, step.body, headers)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                if isinstance(step, Garbage):
                    self.wfile.write(step.payload.encode())
                    return
                if isinstance(step, CutMidToolCall):
                    delta = {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_cut",
                                "type": "function",
                                "function": {"name": step.name, "arguments": '{"pa'},
                            }
                        ]
                    }
                    self._event({"choices": [{"index": 0, "delta": delta}]})
                    return  # connection closes without finish_reason or [DONE]
                try:
                    self._stream_reply(step, number, body)
                except (BrokenPipeError, ConnectionResetError):
                    server.aborted.set()

            def _event(self, chunk: dict[str, Any]) -> None:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()

            def _stream_reply(self, reply: Reply, number: int, body: dict[str, Any]) -> None:
                base = {"id": f"chatcmpl-{number}", "object": "chat.completion.chunk"}
                self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
                if reply.reasoning:
                    delta = {"reasoning_content": reply.reasoning}
                    self._event({**base, "choices": [{"index": 0, "delta": delta}]})
                for piece in _pieces(reply.text):
                    self._event({**base, "choices": [{"index": 0, "delta": {"content": piece}}]})
                if reply.stall:
                    server.stalled.set()
                    while not server.release.wait(0.05):
                        self.wfile.write(b": keep-alive\n\n")  # notices a closed connection
                        self.wfile.flush()
                for index, (name, arguments) in enumerate(reply.tool_calls):
                    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
                    first = {
                        "index": index,
                        "id": f"call_{number}_{index}",
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }
                    self._event(
                        {**base, "choices": [{"index": 0, "delta": {"tool_calls": [first]}}]}
                    )
                    for piece in _pieces(raw):
                        more = {"index": index, "function": {"arguments": piece}}
                        delta = {"tool_calls": [more]}
                        self._event({**base, "choices": [{"index": 0, "delta": delta}]})
                finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
                self._event(
                    {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
                )
                prompt = len(json.dumps(body.get("messages", []))) // 4
                usage = {
                    "prompt_tokens": prompt,
                    "completion_tokens": max(1, len(reply.text) // 4),
                    "total_tokens": prompt + 1,
                    "prompt_tokens_details": {"cached_tokens": prompt // 2},
                }
                self._event({**base, "choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        return Handler


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def wait_for(flag: threading.Event, timeout: float = 10.0) -> None:
    wait_until(flag.is_set, timeout, "the scripted server never got there")


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll `condition`; the server having sent text is not the client having shown it."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what or "the condition never held")
        time.sleep(0.01)
