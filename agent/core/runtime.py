"""Putting an agent together: client, session, tools, policy, context, event stream.

Front ends (headless, TUI) call `open_runtime` with their options and their
event sink and get a ready `Agent`; they contain no wiring of their own.
The session journal is always the first sink, so an event is on its way to
disk before any display sees it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.clients import HTTPClient, LLMClient, start_local_client
from agent.core.clients.engine_profile import LOCAL_DEFAULT_MODEL
from agent.core.clients.http import repository_key
from agent.core.config import DEFAULTS, AgentConfig
from agent.core.context import ContextSettings, ResidentContext
from agent.core.conversation import Conversation
from agent.core.events import EventEmitter, EventSink, SessionStarted
from agent.core.hooks import open_hooks
from agent.core.loop import Agent, AgentSettings, snapshot_event
from agent.core.mcp.session import McpSession, open_mcp
from agent.core.session import Session, SessionStore, data_dir
from agent.core.subagents import SubagentLauncher, TaskTool
from agent.core.todo import TodoList, TodoWriteTool
from agent.core.tool_runner import ApprovalCallback, ToolRunner
from tools import (
    ApprovalMode,
    PermissionPolicy,
    Registry,
    Tool,
    ToolContext,
    default_tools,
    open_checkpoint_store,
)
from tools.checkpoints.protocol import prune
from tools.context import FileAccess
from tools.process.limits import process_cap_mechanism
from tools.sandbox.bubblewrap import Sandbox, SandboxUnavailable, detect_sandbox
from tools.sandbox.grants import SandboxSettings

# The engine's default model (the agent names none of its own); bench/ scripts read it here.
DEFAULT_MODEL = LOCAL_DEFAULT_MODEL
# Checkpoints a workspace keeps: /undo walks back through recent edits; older
# snapshots only hold disk (the git store's objects, the copy store's files).
KEEP_CHECKPOINTS = 50

log = logging.getLogger(__name__)


@dataclass
class RuntimeOptions:
    """What `open_runtime` takes. The settings a person gives are AgentConfig's
    (agent/core/config.py), defaults included; `from_config` is the one place a
    config becomes RuntimeOptions. The rest (workspace, context, checkpoints) is
    set by code: tests, benchmarks, subagents."""

    workspace: Path = field(default_factory=Path.cwd)
    model: str | None = DEFAULTS.model  # local: name, folder or .gguf; attached: the served model
    attach: str | None = DEFAULTS.attach  # URL of an OpenAI-compatible server
    api_key: str | None = DEFAULTS.api_key
    context_window: int | None = DEFAULTS.context_window
    approval: ApprovalMode = DEFAULTS.approval
    allow: tuple[str, ...] = DEFAULTS.allow
    deny: tuple[str, ...] = DEFAULTS.deny
    tools: tuple[str, ...] | None = DEFAULTS.tool_names  # offer only these tools (None: all)
    resume: str | None = DEFAULTS.resume  # a session id
    continue_last: bool = DEFAULTS.continue_last  # the latest session of this workspace
    settings: AgentSettings = field(default_factory=AgentSettings)
    context: ContextSettings = field(default_factory=ContextSettings)
    checkpoints: bool = True
    network: bool = DEFAULTS.network  # shell commands may use the network
    sandbox_env: tuple[str, ...] = DEFAULTS.sandbox_env  # more variables shell commands may see
    sandbox_read: tuple[Path, ...] = DEFAULTS.sandbox_read  # more folders shell commands may read

    @classmethod
    def from_config(cls, config: AgentConfig) -> RuntimeOptions:
        """The runtime's options for the settings `config` holds (`resident`, `run`, `acp`)."""
        return cls(
            model=config.model,
            attach=config.attach,
            api_key=config.api_key,
            context_window=config.context_window,
            approval=config.approval,
            allow=config.allow,
            deny=config.deny,
            tools=config.tool_names,
            resume=config.resume,
            continue_last=config.continue_last,
            settings=AgentSettings(max_turns=config.max_turns, max_tokens=config.max_tokens),
            network=config.network,
            sandbox_env=config.sandbox_env,
            sandbox_read=config.sandbox_read,
        )

    def as_config(self) -> AgentConfig:
        """The agent settings these options hold, for showing them (`/settings`); not
        validated, since code may set what no flag allows (a tiny window in a test)."""
        return AgentConfig.model_construct(
            model=self.model,
            attach=self.attach,
            api_key=self.api_key,
            context_window=self.context_window,
            approval=self.approval,
            max_turns=self.settings.max_turns,
            max_tokens=self.settings.max_tokens,
            resume=self.resume,
            continue_last=self.continue_last,
            allow=self.allow,
            deny=self.deny,
            tools=",".join(self.tools) if self.tools is not None else None,
            network=self.network,
            sandbox_env=self.sandbox_env,
            sandbox_read=self.sandbox_read,
        )


@dataclass
class Runtime:
    agent: Agent
    session: Session
    client: LLMClient
    emitter: EventEmitter
    sandbox: Sandbox | SandboxUnavailable | None = None
    mcp: McpSession | None = None  # the session's MCP servers, when any are configured
    todos: TodoList = field(default_factory=TodoList)  # the model's todo list (todo_write)

    async def stop_mcp(self) -> None:
        """Stop the MCP servers (they end with the session)."""
        mcp, self.mcp = self.mcp, None
        if mcp is not None:
            await asyncio.to_thread(mcp.close)

    async def close(self) -> None:
        await self.stop_mcp()
        self.session.close()
        await self.client.aclose()


class UnknownToolError(ValueError):
    pass


def agent_tools(
    launcher: SubagentLauncher | None = None, todos: TodoList | None = None
) -> list[Tool]:
    """Tools the agent itself carries out; tools/ holds those that act on the workspace."""
    return [TaskTool(launcher or SubagentLauncher()), TodoWriteTool(todos or TodoList())]


def make_registry(names: tuple[str, ...] | None, own: list[Tool] | None = None) -> Registry:
    """The tools offered to the model; fewer tools make a shorter prompt for small models.
    `own`: the agent's own tools, bound to this session (default: unbound ones, enough
    to check names)."""
    tools = default_tools() + (agent_tools() if own is None else own)
    if names is None:
        return Registry(tools)
    known = {tool.name for tool in tools}
    unknown = sorted(set(names) - known)
    if unknown:
        raise UnknownToolError(
            f"unknown tool(s) {', '.join(unknown)}; the tools are {', '.join(sorted(known))}"
        )
    return Registry(tool for tool in tools if tool.name in names)


def make_client(options: RuntimeOptions) -> LLMClient:
    if options.attach:
        return HTTPClient(
            options.attach,
            model=options.model,
            api_key=options.api_key,
            context_window=options.context_window,
        )
    return start_local_client(options.model)  # None: the engine's default model


def _open_session(
    options: RuntimeOptions, store: SessionStore, workspace: Path, model: str, task: str
) -> tuple[Session, bool]:
    """The session to write to, and whether it is an earlier one resumed."""
    if options.resume:
        return store.open(options.resume), True
    if options.continue_last:
        latest = store.latest(workspace)
        if latest is not None:
            return latest, True
    return store.create(workspace, model, title=task), False


def _describe_sandbox(sandbox: Sandbox | SandboxUnavailable) -> str:
    if isinstance(sandbox, SandboxUnavailable):
        return sandbox.describe()
    return f"{sandbox.describe()}; process cap: {process_cap_mechanism()}"


async def open_runtime(
    options: RuntimeOptions,
    sinks: list[EventSink],
    approve: ApprovalCallback | None = None,
    client: LLMClient | None = None,
    task: str = "",
    file_access: FileAccess | None = None,
) -> Runtime:
    """A ready agent, its first events (session_started, context_snapshot) emitted.

    `file_access`: an editor the file tools read and write through (the ACP
    front end passes the client's, when it offers file access).
    Raises the client's errors (unreachable server, unknown context window) and
    SessionNotFound; the caller decides the exit code.
    """
    workspace = Path(os.path.realpath(options.workspace))
    launcher = SubagentLauncher()  # bound to the agent once it exists
    todos = TodoList()  # announced through the emitter once there is one
    registry = make_registry(options.tools, agent_tools(launcher, todos))
    client = client or make_client(options)
    try:
        if isinstance(client, HTTPClient):
            await client.resolve_model()
        window = await client.context_window()
        store = SessionStore()
        session, resumed = _open_session(options, store, workspace, client.model, task)
    except BaseException:
        await client.aclose()
        raise
    # Behind a router, the repository's requests (every session's, subagents' too) stay
    # on the replica that caches its snapshot.
    client.bind_session(repository_key(workspace))
    emitter = EventEmitter([session.journal, *sinks], next_seq=session.next_seq())
    todos.listener = emitter.emit
    if resumed:
        todos.restore(session.load_events())
    sandbox = detect_sandbox(workspace)
    tool_context = ToolContext(
        workspace=workspace,
        sandbox=sandbox if isinstance(sandbox, Sandbox) else None,
        sandbox_settings=SandboxSettings(
            network=options.network,
            env_names=options.sandbox_env,
            read_only_paths=options.sandbox_read,
        ),
        file_access=file_access,
    )
    policy = PermissionPolicy.for_context(
        tool_context, options.approval, allow=options.allow, deny=options.deny
    )
    checkpoints = open_checkpoint_store(workspace, data_dir()) if options.checkpoints else None
    if checkpoints is not None:
        try:  # housekeeping when a session opens; it must never stop one opening
            await asyncio.to_thread(prune, checkpoints, KEEP_CHECKPOINTS)
        except Exception as err:
            log.warning("could not prune old checkpoints: %s", err)
    # The user's and the repository's hooks (None without a hooks file: no cost at all).
    hooks = open_hooks(workspace, tool_context, lambda: policy.mode, session.id, emitter.emit)
    runner = ToolRunner(registry, tool_context, policy, emitter, approve, checkpoints, hooks)
    # MCP servers join the full tool set; a run limited to named tools (--tools) gets none.
    mcp = (
        open_mcp(workspace, tool_context, registry, emitter.emit) if options.tools is None else None
    )
    context = ResidentContext(
        workspace,
        client,
        registry.schemas(),
        tool_context,
        settings=options.context,
        catalog=mcp.catalog if mcp is not None else None,
    )
    conversation = Conversation(
        session.load_messages(),
        on_append=session.append_messages,
        on_reset=session.reset_messages,
    )
    emitter.emit(
        SessionStarted(
            session_id=session.id,
            model=client.describe(),
            workspace=str(workspace),
            approval=options.approval.value,
            context_window=window,
            resumed=resumed,
            sandbox=_describe_sandbox(sandbox),
        )
    )
    if mcp is not None:
        mcp.start()  # in the background: the session does not wait for its servers
    try:
        snapshot = await context.start(task)
    except BaseException:
        if mcp is not None:
            await asyncio.to_thread(mcp.close)
        raise
    emitter.emit(snapshot_event(snapshot, client.token_count_method))
    if hooks is not None:  # what did not load or run, then the session_start hooks
        await hooks.session_start(resumed)
    agent = Agent(client, context, runner, emitter, conversation, options.settings)
    launcher.bind(agent)
    agent.todos = todos
    return Runtime(
        agent=agent,
        session=session,
        client=client,
        emitter=emitter,
        sandbox=sandbox,
        mcp=mcp,
        todos=todos,
    )
