"""What a request asks its output to conform to: plain data, no grammar engine.

A `StructuredOutput` travels inside `SamplingParams`, so it must be cheap to
build and copy and must not import xgrammar (most requests never use it).
`engine.grammar.builder` turns it into a grammar, `engine.grammar.backend`
compiles that for one tokenizer.

The body is one of:

- `json_schema`: a JSON Schema the output must validate against;
- `json_object`: any JSON object;
- `regex`: text matching a regular expression;
- `tool_calls`: tool calls in the model's own format (`ToolCallConstraint`).

`json_schema`/`json_object` may be combined with a `tool_calls` constraint
whose `required` is set: the output is then either the JSON answer or calls
(`response_format` with `tool_choice: "auto"`: the model may still call).

`reasoning` says what comes before the body for thinking models: `"none"`,
`"optional"` (a `<think>...</think>` block may come first) or `"open"` (the
prompt already opened `<think>`, so the output starts inside the reasoning and
must close it before the body).

`prefix` is text the answer has already begun with, at the end of the prompt
(an assistant message being continued): the grammar reads it before the
first generated token, so a call opened in the prompt is finished validly.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.errors import EngineError

REASONING_MODES = ("none", "optional", "open")
# Tool-call formats a grammar can be built for: the tool parsers' names.
TOOL_CALL_FORMATS = ("hermes", "glm45", "glm47", "kimi_k2")


class GrammarError(EngineError):
    """A structured-output request that cannot be turned into a grammar (bad or unsupported)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolSchema:
    name: str
    parameters: dict[str, Any] | bool  # a JSON schema for the arguments object


@dataclass(frozen=True)
class ToolCallConstraint:
    """Calls written in `format` (a tool parser's name) to one of `tools`.

    `required`: the output is one or more calls and nothing else (with one
    tool and `parallel=False`, exactly that call). Otherwise the model writes
    free text, and a call it opens (its format's opening marker) must be
    complete and valid.
    """

    format: str
    tools: tuple[ToolSchema, ...]
    required: bool
    parallel: bool = True

    def __post_init__(self) -> None:
        if self.format not in TOOL_CALL_FORMATS:
            raise GrammarError(
                f"no tool-call grammar for format {self.format!r} "
                f"(known: {', '.join(TOOL_CALL_FORMATS)})"
            )
        if not self.tools:
            raise GrammarError("a tool-call constraint needs at least one tool", param="tools")
        names = [tool.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise GrammarError("tool names must be unique", param="tools")


@dataclass(frozen=True)
class StructuredOutput:
    json_schema: dict[str, Any] | bool | None = None
    json_object: bool = False
    regex: str | None = None
    tool_calls: ToolCallConstraint | None = None
    reasoning: str = "none"
    prefix: str = ""
    # Where the request put the constraint (for error messages): e.g. "response_format".
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        bodies = sum((self.json_schema is not None, self.json_object, self.regex is not None))
        if bodies > 1:
            raise GrammarError("give one of json_schema, json_object and regex")
        if bodies == 0 and self.tool_calls is None:
            raise GrammarError(
                "a structured output needs a json_schema, json_object, regex or tool_calls"
            )
        if bodies and self.tool_calls is not None and not self.tool_calls.required:
            raise GrammarError("an answer format combines only with required tool calls")
        if self.regex is not None and self.tool_calls is not None:
            raise GrammarError("a regex does not combine with tool calls")
        if self.reasoning not in REASONING_MODES:
            raise GrammarError(f"reasoning must be one of {', '.join(REASONING_MODES)}")
        if self.json_schema is not None and not isinstance(self.json_schema, (dict, bool)):
            raise GrammarError("a JSON schema must be an object (or a boolean)", self.source)

    # ----- constructors ---------------------------------------------------------
    @classmethod
    def for_json_schema(cls, schema: dict[str, Any] | bool, **kwargs: Any) -> StructuredOutput:
        return cls(json_schema=schema, **kwargs)

    @classmethod
    def for_json_object(cls, **kwargs: Any) -> StructuredOutput:
        return cls(json_object=True, **kwargs)

    @classmethod
    def for_regex(cls, pattern: str, **kwargs: Any) -> StructuredOutput:
        return cls(regex=pattern, **kwargs)

    @classmethod
    def for_tool_calls(
        cls,
        format: str,
        tools: list[dict[str, Any]],
        *,
        required: bool,
        parallel: bool = True,
        **kwargs: Any,
    ) -> StructuredOutput:
        """From OpenAI-shaped tools (`{"type": "function", "function": {...}}`)."""
        return cls(
            tool_calls=ToolCallConstraint(format, tool_schemas(tools), required, parallel),
            **kwargs,
        )

    def key(self) -> str:
        """A canonical string for caching what is compiled from this spec."""
        data = asdict(self)
        data.pop("source", None)
        return json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)


def reasoning_mode(reasoning: bool, starts_in_reasoning: bool) -> str:
    """The `reasoning` of a spec for a rendered chat (engine.rendering.RenderedChat flags)."""
    if starts_in_reasoning:
        return "open"
    return "optional" if reasoning else "none"


def tool_schemas(tools: list[dict[str, Any]]) -> tuple[ToolSchema, ...]:
    """(name, parameters) of OpenAI function tools; a tool without parameters takes any object."""
    schemas = []
    for index, tool in enumerate(tools):
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise GrammarError(f"tool {index} has no function name", param=f"tools.{index}")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object"}
        if not isinstance(parameters, (dict, bool)):
            raise GrammarError(
                f"parameters of tool {name!r} must be a JSON schema object",
                param=f"tools.{index}.function.parameters",
            )
        schemas.append(ToolSchema(name, parameters))
    return tuple(schemas)
