"""The conversation: the agent's events drawn as blocks, one group per task.

A group holds a user message and everything that answered it, so `/undo`
can take whole tasks away. Only the latest groups stay mounted (a long
session stays fast to lay out and scroll); older ones fold into a line that
brings them back on demand, redrawn from their events.
"""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalGroup, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Collapsible, Static

from agent.core.approval_preview import Preview
from agent.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    CheckpointTaken,
    Compaction,
    ContextSnapshot,
    ErrorEvent,
    Event,
    HookRun,
    McpServer,
    PlanProposed,
    ReasoningDeltaEvent,
    SessionCompleted,
    SessionStarted,
    SubagentCompleted,
    SubagentEvent,
    SubagentStarted,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
    TurnCompleted,
    TurnStarted,
    Usage,
    UserMessage,
)
from agent.core.tool_runner import ApprovalRequest
from agent.tui.format import tokens
from agent.tui.widgets.approval import ApprovalPrompt
from agent.tui.widgets.assistant import AssistantBlock
from agent.tui.widgets.notes import ErrorNote, Note
from agent.tui.widgets.reasoning import ReasoningBlock
from agent.tui.widgets.subagent_log import SubagentLog
from agent.tui.widgets.tool_block import ToolBlock
from agent.tui.widgets.user_block import UserBlock

KEEP_GROUPS = 40  # task groups kept mounted
SHOW_MORE = 20  # groups brought back per request


class TaskGroup(VerticalGroup):
    DEFAULT_CSS = "TaskGroup { height: auto; }"

    def __init__(self, user_text: str | None = None) -> None:
        super().__init__()
        self.user_text = user_text
        self.events: list[Event] = []
        self.checkpoints: set[str] = set()
        self.text: AssistantBlock | None = None
        self.reasoning: ReasoningBlock | None = None
        self.interrupted = False


class EarlierMessages(Static):
    """Stands for the groups taken out of the screen; a click brings some back."""

    DEFAULT_CSS = """
    EarlierMessages { height: auto; color: $text-muted; text-align: center; display: none; }
    EarlierMessages.-some { display: block; }
    EarlierMessages:hover { color: $text; }
    """

    class Show(Message):
        pass

    def set_count(self, tasks: int) -> None:
        self.set_class(tasks > 0, "-some")
        noun = "task" if tasks == 1 else "tasks"
        self.update(f"▲ {tasks} earlier {noun} · click or press ctrl+up to show more")

    def on_click(self) -> None:
        self.post_message(self.Show())


def coalesce(events: list[Event]) -> list[Event]:
    """Events with runs of text (or reasoning) deltas joined: history draws in whole blocks."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, TextDelta | ReasoningDeltaEvent) and type(last) is type(event):
            out[-1] = event.model_copy(update={"text": last.text + event.text})  # type: ignore[union-attr]
        else:
            out.append(event)
    return out


def _split(events: list[Event]) -> list[list[Event]]:
    """Events into groups: a new one at each user message and each session start."""
    groups: list[list[Event]] = []
    for event in events:
        if not groups or isinstance(event, UserMessage | SessionStarted):
            groups.append([])
        groups[-1].append(event)
    return groups


class ConversationView(VerticalScroll):
    DEFAULT_CSS = """
    ConversationView { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.earlier = EarlierMessages()
        self._group: TaskGroup | None = None
        self._tools: dict[str, ToolBlock] = {}
        self._hidden: list[TaskGroup] = []  # unmounted groups, oldest first
        self.keep = KEEP_GROUPS

    def compose(self):
        yield self.earlier

    def on_mount(self) -> None:
        self.anchor()

    # -- groups ------------------------------------------------------------------------

    @property
    def groups(self) -> list[TaskGroup]:
        return list(self.query_children(TaskGroup))

    @property
    def hidden_count(self) -> int:
        return len(self._hidden)

    async def _new_group(self, user_text: str | None) -> TaskGroup:
        if self._group is not None:
            await self._end_text(self._group)
        self._group = TaskGroup(user_text)
        await self.mount(self._group)
        await self._prune()
        return self._group

    async def _prune(self) -> None:
        groups = self.groups
        extra = len(groups) - self.keep
        if extra <= 0:
            return
        for group in groups[:extra]:
            self._hidden.append(group)
            for block in group.query(ToolBlock):
                self._tools.pop(block.call_id, None)
        await self.remove_children(groups[:extra])
        self.earlier.set_count(len(self._hidden))

    async def show_earlier(self, count: int = SHOW_MORE) -> int:
        """Bring back up to `count` hidden groups, redrawn from their events."""
        if not self._hidden:
            return 0
        back, self._hidden = self._hidden[-count:], self._hidden[:-count]
        fresh = [TaskGroup(old.user_text) for old in back]
        await self.mount_all(fresh, after=self.earlier)
        for old, group in zip(back, fresh, strict=True):
            for event in coalesce(old.events):
                await self._draw(group, event, live=False)
            await self._end_text(group)
            group.events = old.events
            group.checkpoints = old.checkpoints
        self.keep = max(self.keep, len(self.groups))
        self.earlier.set_count(len(self._hidden))
        return len(back)

    async def clear(self) -> None:
        await self.remove_children(self.groups)
        self._group = None
        self._tools.clear()
        self._hidden.clear()
        self.keep = KEEP_GROUPS
        self.earlier.set_count(0)

    # -- events ------------------------------------------------------------------------

    async def handle(self, event: Event, live: bool = True) -> None:
        if isinstance(event, Usage | SessionCompleted):  # the status bar's, or nothing to draw
            if self._group is not None:
                self._group.events.append(event)
            return
        if isinstance(event, UserMessage):
            group = await self._new_group(event.text)
        elif isinstance(event, SessionStarted) or self._group is None:
            group = await self._new_group(None)
        else:
            group = self._group
        group.events.append(event)
        await self._draw(group, event, live)

    async def replay(self, events: list[Event]) -> None:
        """Draw a resumed session's history: the latest groups, the rest folded away."""
        await self.clear()
        parts = _split(coalesce(events))
        for part in parts[: -self.keep] if len(parts) > self.keep else []:
            group = TaskGroup(next((e.text for e in part if isinstance(e, UserMessage)), None))
            group.events = part
            self._hidden.append(group)
        self.earlier.set_count(len(self._hidden))
        for part in parts[-self.keep :]:
            for event in part:
                await self.handle(event, live=False)
        if self._group is not None:
            await self._end_text(self._group)

    async def _end_text(self, group: TaskGroup) -> None:
        if group.text is not None:
            await group.text.finish()
        group.text = None
        group.reasoning = None

    async def _add(self, group: TaskGroup, widget: Widget) -> None:
        await group.mount(widget)

    async def _draw(self, group: TaskGroup, event: Event, live: bool) -> None:
        if isinstance(event, SessionStarted):
            verb = "Resumed" if event.resumed else "New"
            await self._add(
                group,
                Note(
                    f"{verb} session {event.session_id} · {event.model} · "
                    f"{event.context_window:,}-token window · approval {event.approval}"
                ),
            )
            if event.sandbox.startswith("none"):
                await self._add(
                    group,
                    Note(
                        f"No sandbox ({event.sandbox.removeprefix('none: ')}): every shell "
                        "command asks first, and read-only mode offers no shell.",
                        "warning",
                    ),
                )
        elif isinstance(event, UserMessage):
            await self._add(group, UserBlock(event.text))
        elif isinstance(event, TurnStarted | TurnCompleted):
            await self._end_text(group)
            if isinstance(event, TurnCompleted) and event.finish_reason == "interrupted":
                await self.note_interrupted(group)
            elif isinstance(event, TurnCompleted) and event.finish_reason == "length":
                await self._add(group, Note("The answer hit the token limit.", "warning"))
        elif isinstance(event, ReasoningDeltaEvent):
            if group.reasoning is None:
                group.reasoning = ReasoningBlock(collapsed=not live)
                await self._add(group, group.reasoning)
            group.reasoning.append(event.text)
        elif isinstance(event, TextDelta):
            if group.text is None:
                group.text = AssistantBlock("" if live else event.text)
                await self._add(group, group.text)
                if not live:
                    return
            await group.text.write(event.text)
        elif isinstance(event, ToolCallEvent):
            await self._end_text(group)
            block = ToolBlock(event.id, event.name, event.arguments)
            self._tools[event.id] = block
            await self._add(group, block)
        else:
            await self._draw_more(group, event)

    async def _draw_more(self, group: TaskGroup, event: Event) -> None:
        if isinstance(event, ApprovalRequested | ApprovalResolved | ToolResultEvent):
            block = self._tools.get(event.id)
            if block is not None:
                await self._tool_event(block, event)
        elif isinstance(event, CheckpointTaken):
            group.checkpoints.add(event.checkpoint_id)
            await self._add(group, Note("Checkpoint taken before the first change (/undo).", ""))
        elif isinstance(event, Compaction):
            title = (
                f"Compacted {event.messages_before} messages "
                f"({tokens(event.tokens_before)} tokens) into a summary"
            )
            summary = Static(event.summary, markup=False)
            await self._add(group, Collapsible(summary, title=title, collapsed=True))
        elif isinstance(event, ContextSnapshot):
            what = "repository" if event.mode == "full" else "repository map"
            approx = "~" if event.token_count == "estimate" else ""
            left_out = f", {event.omitted} left out" if event.omitted else ""
            await self._add(
                group,
                Note(
                    f"Resident: {what}, {event.files} files in full{left_out}, "
                    f"{approx}{tokens(event.tokens)} tokens (epoch {event.epoch})."
                ),
            )
        elif isinstance(event, ErrorEvent):
            await self._end_text(group)
            await self._add(group, ErrorNote(event.message, event.kind, event.fatal))
        elif isinstance(event, McpServer):
            await self._mcp_note(group, event)
        elif isinstance(event, HookRun):
            await self._hook_note(group, event)
        elif isinstance(event, SubagentStarted | SubagentEvent | SubagentCompleted):
            await self._subagent(event)
        elif isinstance(event, PlanProposed):
            await self._end_text(group)
            await self._add(group, Note("Plan proposed (plan mode): nothing has been changed."))

    async def _mcp_note(self, group: TaskGroup, event: McpServer) -> None:
        """One line when a server fails or leaves tools out; a working server is quiet
        (/mcp lists it)."""
        if event.state == "failed":
            await self._end_text(group)
            text = f"MCP server {event.server} failed: {event.reason} (its tools are unavailable)"
            await self._add(group, Note(text, "warning"))
        elif event.state == "ready" and event.skipped:
            text = f"MCP server {event.server}: left out {'; '.join(event.skipped)}"
            await self._add(group, Note(text, "warning"))

    async def _hook_note(self, group: TaskGroup, event: HookRun) -> None:
        """One line when a hook blocked or added something; a hook that failed shows as its
        error event, and a quiet success shows nothing."""
        where = f"{event.hook_event} {event.tool}".strip()
        first = event.message.strip().splitlines()[0] if event.message.strip() else ""
        if event.outcome == "blocked":
            verb = {"stop": "sent the task back", "post_tool": "answered"}.get(
                event.hook_event, "blocked"
            )
            await self._end_text(group)
            await self._add(group, Note(f"Hook {event.name} ({where}) {verb}: {first}", "warning"))
        elif event.outcome == "allowed" and first:
            await self._add(group, Note(f"Hook {event.name} ({where}) added context: {first}"))

    async def _subagent(self, event: SubagentStarted | SubagentEvent | SubagentCompleted) -> None:
        """A child's work folds into its task call's block."""
        block = self._tools.get(event.id)
        if block is None:
            return
        if isinstance(event, SubagentStarted):
            await block.add(SubagentLog(event))
            block.set_status("running", "subagent working")
            return
        logs = block.query(SubagentLog)
        if not logs:
            return
        if isinstance(event, SubagentEvent):
            logs.first().record(event)
            block.set_status(block.status, logs.first().progress())
        else:
            block.finished_detail = logs.first().finished(event)
            block.set_status(block.status, block.finished_detail)

    async def _tool_event(self, block: ToolBlock, event: Event) -> None:
        if isinstance(event, ApprovalRequested):
            block.set_status("pending", f"waiting for approval: {event.reason}")
        elif isinstance(event, ApprovalResolved):
            for prompt in block.query(ApprovalPrompt):
                await prompt.remove()
            if event.approved:
                block.set_status("running", "approved")
            else:
                nobody = "nobody could approve it" if event.by == "unavailable" else ""
                said = f"denied: {event.message}" if event.message else "denied"
                block.set_status("denied", nobody or said)
        elif isinstance(event, ToolResultEvent):
            await block.finish(event.ok, event.output, event.truncated, event.data)

    # -- what the app asks for ---------------------------------------------------------

    async def ask(self, request: ApprovalRequest, preview: Preview) -> ApprovalPrompt:
        prompt = ApprovalPrompt(request, preview)
        # A subagent's call has no block of its own: it asks inside its task call's.
        block = self._tools.get(request.call_id) or self._tools.get(request.parent_id)
        if block is not None:
            block.collapsed = False
            await block.add(prompt)
        else:
            group = self._group or await self._new_group(None)
            await self._add(group, prompt)
        self.anchor()
        return prompt

    async def note(self, text: str | Text, kind: str = "") -> Note:
        group = self._group or await self._new_group(None)
        note = Note(str(text), kind)
        await self._add(group, note)
        return note

    async def add_widget(self, widget: Widget) -> None:
        group = self._group or await self._new_group(None)
        await self._add(group, widget)

    async def note_interrupted(self, group: TaskGroup | None = None) -> None:
        group = group or self._group
        if group is None or group.interrupted:
            return
        group.interrupted = True
        await self._add(group, Note("Interrupted.", "warning"))

    async def undo_task(self, checkpoint_id: str) -> str | None:
        """Take away the task that took `checkpoint_id` and all after it; its user text."""
        mounted = self.groups
        for index, group in enumerate(mounted):
            if checkpoint_id in group.checkpoints:
                await self.remove_children(mounted[index:])
                self._group = None
                return group.user_text
        for index, group in enumerate(self._hidden):
            if checkpoint_id in group.checkpoints:
                self._hidden = self._hidden[:index]
                await self.remove_children(mounted)
                self._group = None
                self.earlier.set_count(len(self._hidden))
                return group.user_text
        return None
