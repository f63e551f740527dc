"""`/context`: what is resident in the prompt, by file and by tokens.

Read-only over the resident context and the conversation; a front end shows
the report. Per-file counts are each file's block as it appears in the
snapshot, counted the way the context counts everything else (the local
tokenizer, or the estimate for remote servers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.core.context import ResidentContext
from agent.core.context.snapshot import render_file


@dataclass(frozen=True)
class FileTokens:
    path: str
    tokens: int
    stale: bool = False  # changed on disk since the snapshot was taken


@dataclass(frozen=True)
class ContextReport:
    epoch: int
    mode: str  # "full", "map" or "" before the first snapshot
    window: int
    fixed_tokens: int  # system prompt and tool schemas
    snapshot_tokens: int
    conversation_tokens: int
    messages: int
    token_count: str  # "tokenizer" or "estimate"
    files: list[FileTokens] = field(default_factory=list)  # largest first
    omitted: list[tuple[str, str]] = field(default_factory=list)  # (path, why)

    @property
    def prompt_tokens(self) -> int:
        return self.fixed_tokens + self.snapshot_tokens + self.conversation_tokens

    @property
    def free_tokens(self) -> int:
        return max(0, self.window - self.prompt_tokens)


def context_report(context: ResidentContext, conversation: list[dict[str, Any]]) -> ContextReport:
    snapshot = context.snapshot
    if snapshot is None:
        files: list[FileTokens] = []
        omitted: list[tuple[str, str]] = []
    else:
        stale = set(context.stale_paths())
        files = [
            FileTokens(f.path, context.count(render_file(f)), f.path in stale)
            for f in snapshot.files
        ]
        files.sort(key=lambda f: (-f.tokens, f.path))
        omitted = [(o.path, o.reason) for o in snapshot.omitted]
    snapshot_tokens = context.resident_tokens
    return ContextReport(
        epoch=context.epoch,
        mode=snapshot.mode if snapshot else "",
        window=context.window,
        fixed_tokens=max(0, context.prefix_tokens - snapshot_tokens),
        snapshot_tokens=snapshot_tokens,
        conversation_tokens=context.conversation_tokens(conversation),
        messages=len(conversation),
        token_count=context.client.token_count_method,
        files=files,
        omitted=omitted,
    )
