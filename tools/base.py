"""The tool protocol, tool results and the registry that validates and dispatches calls.

A model's tool call is untrusted input. The registry turns it into either a
validated `ToolCall` or a `ToolResult` error that tells the model what was
wrong and what shape was expected; nothing a model sends raises out of here.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from tools.context import ToolContext
from tools.sandbox.grants import READ_ONLY, SandboxGrant
from tools.schema import (
    ArgumentShapeError,
    check_argument_shape,
    describe_validation_error,
    expected_shape,
    function_schema,
    load_arguments,
)

log = logging.getLogger(__name__)


class ToolResult(BaseModel):
    """What a tool hands back: text for the model plus optional structured data.

    `truncated` says the output was cut to fit a cap; `data` carries things a
    front end may render (a diff for edits, an exit code for shell runs).
    """

    ok: bool
    output: str
    truncated: bool = False
    data: dict[str, Any] = {}

    @classmethod
    def success(cls, output: str, *, truncated: bool = False, **data: Any) -> ToolResult:
        return cls(ok=True, output=output, truncated=truncated, data=data)

    @classmethod
    def error(cls, output: str, **data: Any) -> ToolResult:
        return cls(ok=False, output=output, data=data)


class Arguments(BaseModel):
    """Base for tool argument models: unknown fields are an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


class Effect(str, Enum):
    """What a call can do to the world; the permission policy keys on this."""

    READ = "read"
    WRITE = "write"
    EXECUTE = "execute"


@dataclass(frozen=True)
class ToolAccess:
    """What one call would touch, as the permission policy needs to see it.

    `paths` are as the model gave them (the policy resolves them); `command`
    is set for shell runs; `escalation` names something about this call that
    needs a human even where the mode would otherwise allow it.
    """

    effect: Effect
    summary: str
    paths: tuple[str, ...] = ()
    command: str | None = None
    escalation: str | None = None
    # It runs code the repository holds (a commit's hooks): confined by the sandbox
    # when there is one; without one the policy asks even in full-auto.
    runs_repository_code: bool = False
    # It is carried out by a program outside the agent (an MCP server's tool): nothing
    # about the call says what it touches, so only the mode or a rule naming it allows it.
    external: bool = False
    # The http(s) URL a web fetch would get: the policy judges it by its host
    # (`--network`, allow and deny rules `web_fetch:DOMAIN`), not by the mode.
    url: str | None = None


class Tool(ABC):
    """One capability offered to the model.

    Subclasses set `name`, `description`, `effect` and `Args` (an `Arguments`
    model whose JSON schema is what the model sees), and implement `run`.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    effect: ClassVar[Effect]
    Args: ClassVar[type[Arguments]]

    @abstractmethod
    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Do the work. May raise; the registry turns exceptions into errors."""

    def run_granted(self, args: Any, ctx: ToolContext, grant: SandboxGrant) -> ToolResult:
        """Run with what the permission policy granted this call. Only tools that run
        commands in the sandbox use the grant; the rest ignore it."""
        return self.run(args, ctx)

    # Calls of this tool that only read may run at the same time as their neighbours
    # in one answer (the `task` tool's children share one engine batch).
    concurrent: ClassVar[bool] = False

    async def run_call(self, call: ToolCall, ctx: ToolContext, grant: SandboxGrant) -> ToolResult:
        """Run from the agent's event loop: by default `run_granted` in a worker thread,
        so a slow tool never blocks the loop. A tool whose work is itself asynchronous
        (a child agent, which talks to the model on the same loop) overrides this."""
        return await asyncio.to_thread(self.run_granted, call.args, ctx, grant)

    def for_child(self) -> Tool | None:
        """The tool as a child agent (the `task` tool's subagent) gets it: by default
        this very tool; a tool may hand out a version of its own (one that keeps its
        state apart) or None to keep it from children. The child is still offered the
        same schemas, so its prompt shares the parent's cached prefix."""
        return self

    def access(self, args: Any) -> ToolAccess:
        """What this call touches. Tools that take paths or commands override it."""
        return ToolAccess(effect=self.effect, summary=f"{self.name}")

    def schema(self) -> dict[str, Any]:
        return function_schema(self.name, self.description, self.Args)


@dataclass(frozen=True)
class ToolCall:
    """A call whose arguments passed validation."""

    tool: Tool
    args: Arguments
    call_id: str | None = None
    access: ToolAccess = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "access", self.tool.access(self.args))

    @property
    def name(self) -> str:
        return self.tool.name


class Registry:
    """Holds the tools offered to the model; parses, validates and runs calls."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def unregister(self, name: str) -> None:
        """Take a tool away (an MCP server's, when its server is gone); no error if absent."""
        self._tools.pop(name, None)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI `tools` entries, sorted by name so the prompt prefix is stable."""
        return [self._tools[name].schema() for name in self.names()]

    def parse(
        self, name: str, arguments: str | Mapping[str, Any] | None, call_id: str | None = None
    ) -> ToolCall | ToolResult:
        """Validate a raw call. Returns the call, or a ToolResult error for the model."""
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return ToolResult.error(
                f"Unknown tool {name!r}. Available tools: {', '.join(self.names())}."
            )
        shape = expected_shape(tool.Args)
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            text = arguments.strip()
            try:
                # Some models send "" for a tool without arguments.
                arguments = load_arguments(text) if text else {}
            except ArgumentShapeError as exc:
                return _refused(name, str(exc), shape)
            except ValueError as exc:  # JSONDecodeError, or an integer of 5,000 digits
                return ToolResult.error(
                    f"Arguments for {name!r} are not valid JSON ({exc}). "
                    f"Send a JSON object of the form {shape}."
                )
        if not isinstance(arguments, Mapping):
            return ToolResult.error(
                f"Arguments for {name!r} must be a JSON object, got "
                f"{type(arguments).__name__}. Expected {shape}."
            )
        try:  # arguments handed over already parsed get the same limits
            check_argument_shape(dict(arguments))
        except ArgumentShapeError as exc:
            return _refused(name, str(exc), shape)
        try:
            args = tool.Args.model_validate(dict(arguments))
        except ValidationError as exc:
            return ToolResult.error(
                f"Invalid arguments for {name!r}:\n{describe_validation_error(exc)}\n"
                f"Expected {shape}."
            )
        return ToolCall(tool=tool, args=args, call_id=call_id)

    def run(self, call: ToolCall, ctx: ToolContext, grant: SandboxGrant = READ_ONLY) -> ToolResult:
        """Run a validated call with `grant` (by default a command may only read).
        An unexpected exception becomes an error result."""
        try:
            return call.tool.run_granted(call.args, ctx, grant)
        except Exception as exc:  # a tool bug must not take the agent loop down
            log.exception("tool %s failed", call.name)
            return ToolResult.error(f"{call.name} failed: {type(exc).__name__}: {exc}")

    async def run_async(
        self, call: ToolCall, ctx: ToolContext, grant: SandboxGrant = READ_ONLY
    ) -> ToolResult:
        """Run a validated call from an asyncio agent loop (most tools in a worker
        thread: Tool.run_async). To interrupt a shell command, set `ctx.cancel_event`;
        cancelling the task alone does not. An unexpected exception becomes an error."""
        try:
            return await call.tool.run_call(call, ctx, grant)
        except Exception as exc:  # a tool bug must not take the agent loop down
            log.exception("tool %s failed", call.name)
            return ToolResult.error(f"{call.name} failed: {type(exc).__name__}: {exc}")

    def call(
        self,
        name: str,
        arguments: str | Mapping[str, Any] | None,
        ctx: ToolContext,
        grant: SandboxGrant = READ_ONLY,
    ) -> ToolResult:
        """Parse and run in one step, without any permission check."""
        parsed = self.parse(name, arguments)
        if isinstance(parsed, ToolResult):
            return parsed
        return self.run(parsed, ctx, grant)


def _refused(name: str, why: str, shape: str) -> ToolResult:
    return ToolResult.error(
        f"Arguments for {name!r} were refused: {why}. The call was not run; "
        f"send a JSON object of the form {shape}."
    )
