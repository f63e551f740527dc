"""The tools of a Responses request: function tools, namespaces of them, hosted tools.

- `function` tools are the client's to run: offered to the model as chat tools.
- A `namespace` groups function tools under a name (Codex sends its sub-agent
  tools so). Chat templates know no namespaces, so each inner tool is offered
  as `NAMESPACE.NAME`, and a call to it comes back as a `function_call` with
  `name` and `namespace` apart, as OpenAI's API writes it. History items that
  carry a `namespace` are joined the same way, so the prompt stays stable.
- Hosted tools (`web_search`, `file_search`, `code_interpreter`, ...) run on
  OpenAI's side; this server has none. Codex sends `web_search` with every
  request, so refusing them would refuse every Codex turn: they are left out
  of the prompt (the model is not told of them) and logged. Naming one in
  `tool_choice` is still a 400, since that request cannot be honoured.
- `custom` tools (free-form text input under a grammar) are a 400.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from engine.server.chat_rendering import check_tool_schemas
from engine.server.error_responses import bad_request

log = logging.getLogger(__name__)

NAMESPACE_SEPARATOR = "."


def joined_name(namespace: str | None, name: str) -> str:
    """The name a chat template sees for `name` inside `namespace`."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


@dataclass
class ResponseTools:
    echo: list[dict[str, Any]] = field(default_factory=list)  # as the response shows them
    functions: list[dict[str, Any]] = field(default_factory=list)  # flat, names joined
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # joined -> parts
    left_out: list[str] = field(default_factory=list)  # hosted tools' types

    def split(self, name: str) -> tuple[str, str | None]:
        """A called tool's (name, namespace): namespaced only if the request said so."""
        parts = self.namespaced.get(name)
        return (parts[1], parts[0]) if parts else (name, None)


def _function(tool: dict[str, Any], param: str) -> dict[str, Any]:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"{param}.name is required (a non-empty string)", param=f"{param}.name")
    parameters = tool.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise bad_request("parameters must be a JSON schema object", f"{param}.parameters")
    if parameters is not None:
        check_tool_schemas([(f"{param}.parameters", parameters)])
    return {
        "type": "function",
        "name": name,
        "description": tool.get("description"),
        "parameters": parameters,
        "strict": tool.get("strict"),
    }


def _unsupported(kind: Any, param: str) -> None:
    raise bad_request(
        f"tools of type {kind!r} are not supported by this server; function tools "
        "and namespaces of them are (the client runs them)",
        param=f"{param}.type",
    )


def response_tools(tools: list[dict[str, Any]] | None) -> ResponseTools:
    """The request's tools, checked (400 naming the field for what cannot be served)."""
    result = ResponseTools()
    for index, tool in enumerate(tools or []):
        param = f"tools.{index}"
        if not isinstance(tool, dict):
            raise bad_request("tools must be objects", param=param)
        kind = tool.get("type")
        if kind == "function":
            function = _function(tool, param)
            result.echo.append(function)
            result.functions.append(function)
        elif kind == "namespace":
            namespace = tool.get("name")
            if not isinstance(namespace, str) or not namespace:
                raise bad_request(f"{param}.name is required (a non-empty string)", f"{param}.name")
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise bad_request(f"{param}.tools must be a list of tools", f"{param}.tools")
            members = []
            for number, member in enumerate(inner):
                where = f"{param}.tools.{number}"
                if not isinstance(member, dict) or member.get("type") != "function":
                    _unsupported(member.get("type") if isinstance(member, dict) else None, where)
                function = _function(member, where)
                members.append(function)
                name = joined_name(namespace, function["name"])
                result.namespaced[name] = (namespace, function["name"])
                result.functions.append({**function, "name": name})
            result.echo.append(
                {
                    "type": "namespace",
                    "name": namespace,
                    "description": tool.get("description") or "",
                    "tools": members,
                }
            )
        elif kind in (None, "custom") or not isinstance(kind, str):
            _unsupported(kind, param)
        else:  # a hosted tool: OpenAI runs those, nobody here can
            result.echo.append(dict(tool))
            result.left_out.append(kind)
    if result.left_out:
        log.info("hosted tools left out of the prompt: %s", ", ".join(result.left_out))
    return result
