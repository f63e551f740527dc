"""The resident context: the prompt layout, the snapshot's epochs and its staleness.

Layout (prefix-stable, DESIGN.md §4): one system message holding the static
system prompt, the repository's AGENTS.md instructions and the snapshot
block; the tool schemas, sorted by name, travel as the request's `tools`;
then the conversation. Nothing volatile comes before the conversation, so
every turn's prompt extends the previous one until the epoch changes.

The tool list may grow during a session (MCP servers start in the
background): a `ToolCatalog` gives the schemas at each new epoch, and a
change in its `version` starts a new epoch before the next turn, so the
tools too stay fixed within an epoch.

Edits do not rewrite the snapshot. Before each turn the files shown in full
are checked (size and mtime); when the changed ones hold more than
`stale_fraction` of the snapshot, or after a compaction, a new snapshot is
taken: a new epoch. The snapshot block ends the system message, so the new
epoch's snapshot can keep the previous block's text and append the changed
files (update.py): its first request then prefills only those. When the
copies the updates superseded pass `superseded_fraction` of the current
files, when the changes sit at the block's tail anyway, or when the system
prompt itself changed (an edited AGENTS.md: nothing is cached to keep), the
block is rendered again in the stable order.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import prompts
from agent.core.clients import ChatRequest, LLMClient
from agent.core.context.agents_md import agents_instructions
from agent.core.context.selection import DEFAULT_MAX_FILE_BYTES
from agent.core.context.snapshot import Snapshot, take_snapshot
from agent.core.context.update import DEFAULT_SUPERSEDED_FRACTION
from tools import FileStamp, ToolContext


@dataclass(frozen=True)
class ContextSettings:
    snapshot_fraction: float = 0.5  # of the context window, system prompt and tools included
    stale_fraction: float = 0.25  # of the snapshot's bytes changed: take a new snapshot
    # out-of-date copies a kept block may hold, of its current files' bytes: else re-render
    superseded_fraction: float = DEFAULT_SUPERSEDED_FRACTION
    compact_fraction: float = 0.8  # of the window used by a prompt: compact the conversation
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES


class ToolCatalog(Protocol):
    """Tools that can change during a session (agent/core/mcp/catalog.py)."""

    @property
    def version(self) -> int: ...  # goes up when the tools should change at the next epoch

    def schemas(self) -> list[dict[str, Any]]: ...  # this epoch's, sorted by name

    async def settle(self) -> None: ...  # a bounded wait for tools still on their way


class ResidentContext:
    def __init__(
        self,
        workspace: Path,
        client: LLMClient,
        tool_schemas: list[dict[str, Any]],
        tool_context: ToolContext | None = None,
        settings: ContextSettings | None = None,
        catalog: ToolCatalog | None = None,
    ) -> None:
        self.workspace = Path(os.path.realpath(workspace))
        self.client = client
        self.tool_schemas = tool_schemas
        self.catalog = catalog
        self._tools_version = catalog.version if catalog is not None else 0
        self.tool_context = tool_context
        self.settings = settings or ContextSettings()
        self.window = 0
        self.snapshot: Snapshot | None = None
        self.system_prompt = ""
        self._prefix_tokens = 0
        self._message_tokens: dict[str, int] = {}

    # -- epochs ------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.snapshot.epoch if self.snapshot else 0

    async def start(self, task: str = "") -> Snapshot:
        self.window = await self.client.context_window()
        return self.new_epoch(task)

    def new_epoch(self, task: str = "") -> Snapshot:
        """Render the system prompt and a fresh snapshot within the budget."""
        if self.catalog is not None:
            self._tools_version = self.catalog.version
            self.tool_schemas = self.catalog.schemas()
        before = self.system_prompt
        self.system_prompt = prompts.load("system", workspace=str(self.workspace))
        # Resident's own folders, as the tools find them (the tools' environment too).
        protected = self.tool_context.protected_paths if self.tool_context is not None else None
        agents = agents_instructions(self.workspace, protected)
        if agents:
            self.system_prompt += "\n" + agents
        # The block is kept only behind the same system prompt: a cached prefix to extend.
        keep = self.settings.superseded_fraction if self.system_prompt == before else None
        fixed = self.count(self.system_prompt) + self.count(json.dumps(self.tool_schemas))
        budget = max(0, int(self.window * self.settings.snapshot_fraction) - fixed)
        self.snapshot = take_snapshot(
            self.workspace,
            self.epoch + 1,
            budget,
            self.count,
            task=task,
            max_file_bytes=self.settings.max_file_bytes,
            previous=self.snapshot,
            max_superseded=keep,
            protected=protected,
        )
        self._prefix_tokens = fixed + self.snapshot.tokens
        self._record_reads(self.snapshot)
        return self.snapshot

    def _record_reads(self, snapshot: Snapshot) -> None:
        """Files shown in full count as read, so the model may edit them without a `read`;
        the stamp is of the bytes it was shown, so a later change still blocks the edit."""
        if self.tool_context is None:
            return
        for file in snapshot.files:
            real = Path(os.path.realpath(self.workspace / file.path))
            stamp = FileStamp(size=file.size, mtime_ns=file.mtime_ns, sha256=file.sha256)
            self.tool_context.file_states.record(real, stamp)

    def stale_paths(self) -> list[str]:
        """Files shown in full whose size or mtime changed since the snapshot."""
        if self.snapshot is None:
            return []
        stale = []
        for file in self.snapshot.files:
            try:
                info = os.stat(self.workspace / file.path)
            except OSError:
                stale.append(file.path)
                continue
            if info.st_size != file.size or info.st_mtime_ns != file.mtime_ns:
                stale.append(file.path)
        return stale

    def tools_changed(self) -> bool:
        return self.catalog is not None and self.catalog.version != self._tools_version

    async def settle_tools(self) -> None:
        if self.catalog is not None:
            await self.catalog.settle()

    def needs_new_epoch(self) -> bool:
        if self.tools_changed():
            return True
        if self.snapshot is None or not self.snapshot.files:
            return False
        shown = sum(f.size for f in self.snapshot.files) or 1
        changed = set(self.stale_paths())
        stale_bytes = sum(f.size for f in self.snapshot.files if f.path in changed)
        return stale_bytes / shown > self.settings.stale_fraction

    # -- requests ------------------------------------------------------------------

    def system_message(self) -> dict[str, Any]:
        # The snapshot ends the message: a new epoch's update section, appended to the
        # block, then leaves every earlier token of the message as it was (cached).
        snapshot = self.snapshot.text if self.snapshot else ""
        return {"role": "system", "content": f"{self.system_prompt}\n{snapshot}"}

    def messages(self, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self.system_message(), *conversation]

    def request(
        self,
        conversation: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        with_tools: bool = True,
    ) -> ChatRequest:
        return ChatRequest(
            messages=self.messages(conversation),
            tools=self.tool_schemas if with_tools else [],
            max_tokens=max_tokens,
            temperature=temperature,
            pinned_messages=1,
        )

    # -- token accounting ------------------------------------------------------------

    def count(self, text: str) -> int:
        return self.client.count_tokens(text)

    @property
    def resident_tokens(self) -> int:
        return self.snapshot.tokens if self.snapshot else 0

    @property
    def prefix_tokens(self) -> int:
        """System prompt, tool schemas and snapshot: what every request starts with."""
        return self._prefix_tokens

    def conversation_tokens(self, conversation: list[dict[str, Any]]) -> int:
        total = 0
        for message in conversation:
            text = json.dumps(message, sort_keys=True, ensure_ascii=False)
            key = hashlib.sha1(text.encode()).hexdigest()  # tool outputs can be large
            if key not in self._message_tokens:
                self._message_tokens[key] = self.count(text)
            total += self._message_tokens[key]
        return total

    def prompt_tokens(self, conversation: list[dict[str, Any]]) -> int:
        return self.prefix_tokens + self.conversation_tokens(conversation)

    def over_compaction_threshold(self, conversation: list[dict[str, Any]]) -> bool:
        """The prompt passed the threshold, and the conversation is what fills it: when
        the prefix alone is that large, a summary would not make room."""
        limit = self.window * self.settings.compact_fraction
        talk = self.conversation_tokens(conversation)
        return self.prefix_tokens + talk > limit and talk > (self.window - self.prefix_tokens) / 2
