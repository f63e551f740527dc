"""An MCP server's tool as a Resident tool: registered, validated, approved and run like the rest.

Going through `tools.base.Registry` and the ToolRunner means an MCP call
gets exactly what a built-in call gets: argument checking with an error the
model can act on, the permission policy, the approval prompt, a checkpoint
before the first call that may change files, and one tool result.

Arguments are checked against the tool's own JSON schema (jsonschema) before
the call, so a bad call costs no round trip and reads like any other
argument error. The access is `external`: the agent cannot know what a
server does with a call, so the policy asks unless a rule or full-auto says
otherwise (tools/permissions/policy.py).
"""

from __future__ import annotations

import copy
import json
from typing import Any, ClassVar

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from pydantic import ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from agent.core.mcp.connection import CallFailed
from agent.core.mcp.manager import McpManager
from agent.core.mcp.results import convert
from agent.core.mcp.status import OfferedTool
from tools.base import Arguments, Effect, Tool, ToolAccess, ToolResult
from tools.context import ToolContext
from tools.schema import clean_schema

MAX_SUMMARY_ARGUMENTS = 200
MAX_ERRORS = 5


def parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """The tool's input schema as the model sees it: pydantic-style `title` noise dropped,
    always an object whose properties are schemas (a server's malformed parts left out)."""
    cleaned = clean_schema(copy.deepcopy(schema))
    if not isinstance(cleaned, dict):
        cleaned = {}
    cleaned.pop("$schema", None)
    cleaned["type"] = "object"
    properties = cleaned.get("properties")
    if not isinstance(properties, dict):
        properties = {}
    cleaned["properties"] = {k: v for k, v in properties.items() if isinstance(v, dict)}
    required = cleaned.get("required")
    if required is not None:
        if isinstance(required, list):
            cleaned["required"] = [r for r in required if isinstance(r, str)]
        else:
            del cleaned["required"]
    return cleaned


def arguments_model(schema: dict[str, Any]) -> type[Arguments]:
    """An Arguments class that accepts what `schema` accepts and reports what it does not."""
    validator: Validator | None
    try:
        kind = validator_for(schema, default=Draft202012Validator)  # honours "$schema"
        kind.check_schema(schema)
        validator = kind(schema)
    except SchemaError:
        validator = None  # a server's broken schema: the server judges its own arguments
    shown = parameters(schema)

    class McpArguments(Arguments):
        model_config = ConfigDict(extra="allow")

        @model_validator(mode="before")
        @classmethod
        def _check(cls, data: Any) -> Any:
            if validator is None:
                return data
            errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
            if errors:
                lines = []
                for error in errors[:MAX_ERRORS]:
                    where = ".".join(str(p) for p in error.absolute_path)
                    lines.append(f"{where}: {error.message}" if where else error.message)
                raise PydanticCustomError(
                    "mcp_schema", "{problems}", {"problems": "; ".join(lines)}
                )
            return data

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return copy.deepcopy(shown)

    return McpArguments


def _short(arguments: dict[str, Any]) -> str:
    text = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    if len(text) <= MAX_SUMMARY_ARGUMENTS:
        return text
    return text[: MAX_SUMMARY_ARGUMENTS - 1] + "…"


class McpTool(Tool):
    effect: ClassVar[Effect] = Effect.EXECUTE

    def __init__(self, offered: OfferedTool, manager: McpManager) -> None:
        self.offered = offered
        self.manager = manager
        self.name = offered.name  # type: ignore[misc]
        self.description = (  # type: ignore[misc]
            f"[MCP server {offered.server}] {offered.description}"
        )
        self.Args = arguments_model(offered.input_schema)  # type: ignore[misc]

    @property
    def server(self) -> str:
        return self.offered.server

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters(self.offered.input_schema),
            },
        }

    def access(self, args: Arguments) -> ToolAccess:
        summary = (
            f"MCP server {self.offered.server}: {self.offered.original} {_short(args.model_dump())}"
        )
        return ToolAccess(effect=self.effect, summary=summary, external=True)

    def run(self, args: Arguments, ctx: ToolContext) -> ToolResult:
        if ctx.cancel_event.is_set():
            return ToolResult.error("Not run: the turn was interrupted.")
        try:
            result = self.manager.call(
                self.offered.server, self.offered.original, args.model_dump(), ctx.cancel_event
            )
        except CallFailed as err:
            return ToolResult.error(f"{err}.", mcp=True)
        return convert(result, ctx.limits.shell_output_chars)
