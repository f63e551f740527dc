"""Resident as an ACP agent: the methods an editor calls, over the sessions they open.

What is offered (docs/ACP.md has the whole list): `initialize`;
`session/new` and `session/load` (any session in the session store, its
journal replayed as updates); `session/list`; `session/set_mode` over the
approval modes; `session/prompt` with streamed updates and permission
requests; `session/cancel`. Each session is a runtime of its own
(agent/acp/session.py) on the workspace the client names as `cwd`.

Errors a client caused (an unknown session, a relative cwd, content we do
not take) are JSON-RPC errors with a message that says what to fix; the
server goes on. Nothing here decides what the agent does.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, RequestError
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    ClientCapabilities,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    SessionCapabilities,
    SessionInfo,
    SessionListCapabilities,
    SessionMode,
    SessionModeState,
    SetSessionModeResponse,
)

from agent.acp.engines import Engines
from agent.acp.files import ClientFiles
from agent.acp.session import AcpSession
from agent.core.clients import ClientError
from agent.core.events import Event
from agent.core.runtime import RuntimeOptions, UnknownToolError
from agent.core.session import SessionNotFound, SessionStore
from tools import ApprovalMode

log = logging.getLogger(__name__)

# The approval modes, as the session modes an editor offers in its mode picker:
# the ids are the modes' values, so a client's mode id is what `--approval` takes.
MODES: tuple[SessionMode, ...] = tuple(
    SessionMode(id=mode.value, name=mode.label, description=mode.description)
    for mode in ApprovalMode
)


def _version() -> str:
    try:
        return metadata.version("resident")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def _workspace(cwd: str) -> Path:
    path = Path(cwd)
    if not path.is_absolute():
        raise RequestError.invalid_params({"cwd": f"{cwd!r} is not an absolute path"})
    if not path.is_dir():
        raise RequestError.invalid_params({"cwd": f"{cwd} is not a directory"})
    return Path(os.path.realpath(path))


def _ignore_mcp_servers(servers: list[Any] | None) -> None:
    if servers:
        log.warning("ignoring %d MCP server(s) from the client: not supported", len(servers))


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat()


class ResidentAgent:
    def __init__(self, options: RuntimeOptions) -> None:
        self.options = options
        self.engines = Engines(options)
        self.client: Client | None = None  # the connection, once made
        self.client_capabilities = ClientCapabilities()
        self.sessions: dict[str, AcpSession] = {}

    def on_connect(self, conn: Client) -> None:
        self.client = conn

    # -- initialize ------------------------------------------------------------------

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        self.client_capabilities = client_capabilities or ClientCapabilities()
        if client_info is not None:
            log.info("ACP client: %s %s", client_info.name, client_info.version)
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,  # the one version there is
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(
                    image=False, audio=False, embedded_context=True
                ),
                mcp_capabilities=McpCapabilities(http=False, sse=False),
                session_capabilities=SessionCapabilities(list=SessionListCapabilities()),
            ),
            agent_info=Implementation(name="resident", title="Resident", version=_version()),
            auth_methods=[],
        )

    # -- sessions --------------------------------------------------------------------

    def _files(self) -> ClientFiles:
        fs = self.client_capabilities.fs
        assert self.client is not None
        return ClientFiles(
            self.client,
            asyncio.get_running_loop(),
            reads=bool(fs and fs.read_text_file),
            writes=bool(fs and fs.write_text_file),
        )

    async def _open(self, options: RuntimeOptions, history: list[Event] | None) -> AcpSession:
        if self.client is None:
            raise RequestError.internal_error({"details": "no connection"})
        try:
            session = await AcpSession.open(
                self.client, options, self.engines, self._files(), history
            )
        except ClientError as err:  # the model is unreachable or misconfigured
            raise RequestError(-32603, str(err), {"kind": err.kind}) from None
        except UnknownToolError as err:
            raise RequestError(-32603, str(err)) from None
        self.sessions[session.id] = session
        session.offer_commands_after_reply()  # available_commands_update, after the reply
        return session

    def _modes(self, session: AcpSession) -> SessionModeState:
        return SessionModeState(
            current_mode_id=session.approval().value, available_modes=list(MODES)
        )

    def _session(self, session_id: str) -> AcpSession:
        session = self.sessions.get(session_id)
        if session is None:
            raise RequestError.invalid_params(
                {"sessionId": f"no open session {session_id!r}; use session/new or session/load"}
            )
        return session

    async def new_session(
        self,
        cwd: str,
        additional_directories: list[str] | None = None,
        mcp_servers: list[Any] | None = None,
        **kwargs: Any,
    ) -> NewSessionResponse:
        workspace = _workspace(cwd)
        _ignore_mcp_servers(mcp_servers)
        options = replace(self.options, workspace=workspace, resume=None, continue_last=False)
        session = await self._open(options, None)
        return NewSessionResponse(session_id=session.id, modes=self._modes(session))

    async def load_session(
        self,
        cwd: str,
        session_id: str,
        mcp_servers: list[Any] | None = None,
        additional_directories: list[str] | None = None,
        **kwargs: Any,
    ) -> LoadSessionResponse:
        workspace = _workspace(cwd)
        _ignore_mcp_servers(mcp_servers)
        try:
            stored = SessionStore().open(session_id)
        except SessionNotFound as err:
            raise RequestError.invalid_params({"sessionId": str(err)}) from None
        if stored.id != session_id:  # the store takes prefixes; a client names sessions exactly
            raise RequestError.invalid_params({"sessionId": f"no session {session_id!r}"})
        open_already = self.sessions.pop(session_id, None)
        if open_already is not None:
            if open_already.working:
                self.sessions[session_id] = open_already
                raise RequestError.invalid_request(
                    {"details": "the session is working on a prompt; cancel it first"}
                )
            await open_already.close()  # reopened below, its journal replayed whole
        options = replace(self.options, workspace=workspace, resume=session_id, continue_last=False)
        session = await self._open(options, stored.load_events())
        return LoadSessionResponse(modes=self._modes(session))

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        workspace = _workspace(cwd) if cwd else None
        metas = SessionStore().list(workspace)
        return ListSessionsResponse(
            sessions=[
                SessionInfo(
                    session_id=meta.id,
                    cwd=meta.workspace,
                    title=meta.title or None,
                    updated_at=_iso(meta.updated_at),
                )
                for meta in metas
            ]
        )

    async def set_session_mode(
        self, session_id: str, mode_id: str, **kwargs: Any
    ) -> SetSessionModeResponse:
        session = self._session(session_id)
        try:  # the client's mode id becomes a mode here, at the edge
            mode = ApprovalMode.parse(mode_id)
        except ValueError as err:
            raise RequestError.invalid_params({"modeId": str(err)}) from None
        session.set_approval(mode)
        return SetSessionModeResponse()

    # -- turns -------------------------------------------------------------------------

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        return await self._session(session_id).prompt(prompt)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        session = self.sessions.get(session_id)
        if session is not None:  # a notification: nobody to tell about an unknown id
            session.cancel()

    # -- shutdown ------------------------------------------------------------------------

    async def close(self) -> None:
        sessions, self.sessions = list(self.sessions.values()), {}
        for session in sessions:
            try:
                await session.close()
            except Exception:  # one broken session must not keep the others open
                log.exception("closing session %s failed", session.id)
        await self.engines.aclose()
