"""Compaction: the model summarizes the conversation, the summary replaces it.

The summary request carries the same prefix (system prompt, tools, snapshot)
as every turn, so it reuses the cached prefix; only the compaction prompt
from prompts/ is new. After it the conversation is one message, the summary,
and a new snapshot is taken (a new epoch): files changed during the
conversation appear as they are now.
"""

from __future__ import annotations

import prompts
from agent.core.clients import ChatRequest, ContentDelta, LLMClient, valid_stream
from agent.core.context import ResidentContext
from agent.core.conversation import Conversation, Message

# The summary is a page, not a transcript.
SUMMARY_MAX_TOKENS = 2048


class CompactionFailed(Exception):
    pass


def compaction_request(context: ResidentContext, messages: list[Message]) -> ChatRequest:
    ask = {"role": "user", "content": prompts.load("compaction")}
    room = context.window - context.prompt_tokens([*messages, ask])
    return context.request(
        [*messages, ask], max_tokens=max(1, min(SUMMARY_MAX_TOKENS, room)), temperature=0.0
    )


async def write_summary(client: LLMClient, request: ChatRequest) -> str:
    pieces = []
    async for item in valid_stream(client.stream(request)):
        if isinstance(item, ContentDelta):
            pieces.append(item.text)
    summary = "".join(pieces).strip()
    if not summary:
        raise CompactionFailed("the model wrote an empty summary")
    return summary


def compacted_conversation(summary: str, kept: str = "") -> list[Message]:
    """The summary as the conversation's one message; `kept`: state the model keeps
    through a compaction (its todo list), after the summary."""
    content = prompts.load("compacted", summary=summary)
    if kept:
        content = f"{content.rstrip()}\n\n{kept}"
    return [{"role": "user", "content": content}]


async def compact(
    client: LLMClient, context: ResidentContext, conversation: Conversation, kept: str = ""
) -> str:
    """Replace the conversation with the model's summary of it; returns the summary."""
    summary = await write_summary(client, compaction_request(context, conversation.messages))
    conversation.replace(compacted_conversation(summary, kept))
    return summary
