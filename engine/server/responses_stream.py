"""Model output made into Responses output items and the semantic stream events that build them.

`ResponseAssembler` reads each engine output through the chat pipeline's
output parser (reasoning, then tool calls) and turns the parser's events
into output items: `reasoning` (its text as a `reasoning_text` content
part), `message` (one `output_text` part) and `function_call`, each opened
with `response.output_item.added` and closed with `response.output_item.done`.
A non-streaming response runs the same assembler and drops the events, so
the two can never disagree.

Reasoning is streamed as `response.reasoning_text.*` (the raw chain of
thought, as vLLM and gpt-oss servers do), not as `reasoning_summary_text.*`:
this server writes no summaries, and calling raw thinking a summary would
mislead clients that show summaries to users.

On the wire each event is `event: <type>` plus `data: <json>`, as OpenAI
sends them; there is no `[DONE]`, the stream ends after `response.completed`,
`response.incomplete` or `response.failed`.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from engine.chat import ContentDelta, ReasoningDelta, ToolCallDelta, ToolCallEnd, ToolCallError
from engine.requests.outputs import RequestOutput
from engine.server.chat_rendering import ChatPrompt
from engine.server.error_responses import APIError, GenerationFailed, from_exception
from engine.server.generation import GenerationGroup
from engine.server.responses_protocol import encode_reasoning, new_id, usage
from engine.server.streaming import SSE_HEADERS

log = logging.getLogger(__name__)


class _TextItem:
    """An open reasoning or message item: one content part that grows by deltas."""

    def __init__(self, item: dict[str, Any], output_index: int) -> None:
        self.item = item
        self.output_index = output_index
        self.text = ""

    @property
    def is_reasoning(self) -> bool:
        return self.item["type"] == "reasoning"

    def part(self) -> dict[str, Any]:
        if self.is_reasoning:
            return {"type": "reasoning_text", "text": self.text}
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}


class _CallItem:
    def __init__(self, item: dict[str, Any], output_index: int) -> None:
        self.item = item
        self.output_index = output_index


class ResponseAssembler:
    """One per response: engine outputs in, stream events out, `response` filled in as it goes."""

    def __init__(
        self,
        response: dict[str, Any],
        prompt: ChatPrompt,
        parallel_tool_calls: bool,
        reasoning_token: bool,
        split_name: Callable[[str], tuple[str, str | None]] = lambda name: (name, None),
    ) -> None:
        self.response = response
        self.split_name = split_name  # a namespaced tool's chat name -> (name, namespace)
        self.parser = prompt.output_parser()
        self.clean = prompt.clean
        self.parallel_tool_calls = parallel_tool_calls
        self.reasoning_token = reasoning_token
        self.events: list[dict[str, Any]] = []
        self.sequence = 0
        self.text_item: _TextItem | None = None
        self.calls: dict[int, _CallItem] = {}
        self.first_call: int | None = None
        self.pending_space = ""  # whitespace that opens a message only if text follows
        self.reasoning_tokens = 0

    # -- events -------------------------------------------------------------

    def _emit(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1

    def _take(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events

    def _lifecycle(self, kind: str) -> None:
        # A snapshot: the response dict keeps changing after this event is made.
        self._emit(kind, response=copy.deepcopy(self.response))

    def start(self) -> list[dict[str, Any]]:
        self._lifecycle("response.created")
        self._lifecycle("response.in_progress")
        return self._take()

    # -- items --------------------------------------------------------------

    def _add_item(self, item: dict[str, Any]) -> int:
        self.response["output"].append(item)
        index = len(self.response["output"]) - 1
        self._emit("response.output_item.added", output_index=index, item=copy.deepcopy(item))
        return index

    def _open_text(self, kind: str) -> _TextItem:
        current = self.text_item
        if current is not None and current.item["type"] == kind:
            return current
        self._close_text("completed")
        if kind == "reasoning":
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": []}
        else:
            item = {"id": new_id("msg"), "type": "message", "role": "assistant", "content": []}
        item["status"] = "in_progress"
        opened = _TextItem(item, self._add_item(item))
        self._emit(
            "response.content_part.added",
            item_id=item["id"],
            output_index=opened.output_index,
            content_index=0,
            part=opened.part(),
        )
        self.text_item = opened
        return opened

    def _text_delta(self, kind: str, text: str) -> None:
        opened = self._open_text(kind)
        opened.text += text
        where = {"item_id": opened.item["id"], "output_index": opened.output_index}
        if opened.is_reasoning:
            self._emit("response.reasoning_text.delta", **where, content_index=0, delta=text)
        else:
            self._emit(
                "response.output_text.delta", **where, content_index=0, delta=text, logprobs=[]
            )

    def _close_text(self, status: str) -> None:
        opened, self.text_item = self.text_item, None
        if opened is None:
            return
        item = opened.item
        where = {"item_id": item["id"], "output_index": opened.output_index, "content_index": 0}
        if opened.is_reasoning:
            self._emit("response.reasoning_text.done", **where, text=opened.text)
        else:
            self._emit("response.output_text.done", **where, text=opened.text, logprobs=[])
        self._emit("response.content_part.done", **where, part=opened.part())
        item["content"] = [opened.part()]
        item["status"] = status
        if opened.is_reasoning and self.reasoning_token:
            item["encrypted_content"] = encode_reasoning(opened.text)
        self._emit(
            "response.output_item.done", output_index=opened.output_index, item=copy.deepcopy(item)
        )

    def _call_delta(self, event: ToolCallDelta) -> None:
        if self.first_call is None:
            self.first_call = event.index
        if event.index != self.first_call and not self.parallel_tool_calls:
            return
        call = self.calls.get(event.index)
        if call is None and event.id is not None:
            self._close_text("completed")
            name, namespace = self.split_name(event.name or "")
            item = {
                "id": new_id("fc"),
                "type": "function_call",
                "call_id": event.id,
                "name": name,
                "arguments": "",
                "status": "in_progress",
            }
            if namespace is not None:
                item["namespace"] = namespace
            call = self.calls[event.index] = _CallItem(item, self._add_item(item))
        if call is None or call.item["status"] != "in_progress" or not event.arguments:
            return
        call.item["arguments"] += event.arguments
        self._emit(
            "response.function_call_arguments.delta",
            item_id=call.item["id"],
            output_index=call.output_index,
            delta=event.arguments,
        )

    def _close_call(self, index: int, status: str) -> None:
        call = self.calls.get(index)
        if call is None or call.item["status"] != "in_progress":
            return
        item = call.item
        self._emit(
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=call.output_index,
            name=item["name"],
            arguments=item["arguments"],
        )
        item["status"] = status
        self._emit(
            "response.output_item.done", output_index=call.output_index, item=copy.deepcopy(item)
        )

    def _on(self, event: Any) -> None:
        if isinstance(event, ReasoningDelta):
            self.pending_space = ""
            self._text_delta("reasoning", event.text)
        elif isinstance(event, ContentDelta):
            text = self.pending_space + event.text
            if (self.text_item is None or self.text_item.is_reasoning) and not text.strip():
                self.pending_space = text
                return
            self.pending_space = ""
            self._text_delta("message", text)
        elif isinstance(event, ToolCallDelta):
            self.pending_space = ""
            self._call_delta(event)
        elif isinstance(event, ToolCallEnd):
            self._close_call(event.index, "completed")
        elif isinstance(event, ToolCallError):
            log.info("malformed tool call passed on as text: %s", event.message)
            if event.index is not None:  # announced, then found malformed: it cannot be retracted
                self._close_call(event.index, "incomplete")

    # -- engine outputs -----------------------------------------------------

    def advance(self, output: RequestOutput) -> list[dict[str, Any]]:
        completion = output.outputs[0]
        if completion.finish_reason == "error":
            raise GenerationFailed(output.error or "the engine failed this request")
        text = self.clean(completion.delta_text)
        events = self.parser.feed(text) if text else []
        if output.finished:
            events += self.parser.finish()
        for event in events:
            self._on(event)
        if any(isinstance(event, ReasoningDelta) for event in events):
            # Tokens up to the last one that carried reasoning were spent thinking.
            self.reasoning_tokens = len(completion.token_ids)
        if output.finished:
            self._finish(output)
        return self._take()

    def _finish(self, output: RequestOutput) -> None:
        truncated = output.outputs[0].finish_reason == "length"
        status = "incomplete" if truncated else "completed"
        if not self.response["output"]:
            self._open_text("message")  # clients read output[0]: never leave it empty
        self._close_text(status)
        for index in list(self.calls):
            self._close_call(index, "incomplete")
        self.response.update(
            status=status,
            completed_at=int(time.time()),
            incomplete_details={"reason": "max_output_tokens"} if truncated else None,
            usage=usage(
                len(output.prompt_token_ids),
                output.num_cached_tokens,
                len(output.outputs[0].token_ids),
                self.reasoning_tokens,
            ),
        )
        self._lifecycle("response.incomplete" if truncated else "response.completed")

    def fail(self, error: APIError) -> list[dict[str, Any]]:
        """Close what is open and end the stream with `response.failed` (the status line is sent)."""
        self._close_text("incomplete")
        for index in list(self.calls):
            self._close_call(index, "incomplete")
        code = "server_error" if error.status >= 500 else "invalid_prompt"
        self.response.update(status="failed", error={"code": code, "message": error.message})
        self._lifecycle("response.failed")
        return self._take()


def sse_event(event: dict[str, Any]) -> str:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n"


def stream_response(
    group: GenerationGroup,
    assembler: ResponseAssembler,
    on_done: Callable[[dict[str, Any]], None],
) -> StreamingResponse:
    """Stream a started group's outputs as Responses events; `on_done` gets the finished response.

    When the client disconnects, Starlette cancels this generator and the
    `finally` closes the group, which aborts the engine request.
    """

    async def body() -> AsyncIterator[str]:
        try:
            for event in assembler.start():
                yield sse_event(event)
            async for _, output in group.outputs():
                for event in assembler.advance(output):
                    yield sse_event(event)
            on_done(assembler.response)
        except Exception as error:  # the status line is sent: report in the stream
            for event in assembler.fail(from_exception(error)):
                yield sse_event(event)
        finally:
            await group.close()

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)
