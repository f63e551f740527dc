"""Tool calls in each model's own format, as xgrammar structural-tag formats.

The grammar writes exactly what the engine's tool parsers read
(engine/chat/tool_parsers), so a constrained call goes through the same
parsing as any other:

- hermes:  `<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>`, calls
  separated by a newline;
- glm45 / glm47: `<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>`,
  values as GLM writes them (strings bare, other types as JSON: xgrammar's
  `glm_xml` style), whitespace between tags as the model likes (GLM-4.5 puts
  newlines there, 4.7 does not; the parser ignores it);
- kimi_k2: `<|tool_calls_section_begin|>` then calls
  `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>`
  then `<|tool_calls_section_end|>`.

Arguments follow each tool's JSON schema, in xgrammar's strict mode: no
properties beyond those the schema names, so a weak model cannot wander off
into keys the tool rejects.

The parsers end a call's arguments at the first closing marker they see
(`</tool_call>`, `</arg_value>`, `<|tool_call_end|>`), even inside a JSON
string, where the grammar alone would allow it (a 135M model was seen writing
`</tool_call>` into a command). So string values may not contain the
format's markers (`JSONSchemaFormat.excludes`). xgrammar cannot apply that
together with minLength/maxLength on the same string (it drops the lengths),
so a tool whose schema bounds a string's length keeps its lengths and goes
without the exclusion: the length is part of what "valid arguments" means,
the marker inside a string is a rarer accident.

`required` gives calls and nothing else: one or more (any tools), or with one
tool and `parallel=False` exactly that call. Otherwise (`tool_choice: auto`,
and what the agent asks for) the text is free until the format's opening
marker appears; from there the call must be complete and valid. Kimi's free
text may not contain a bare `<|tool_call_begin|>` or the singular section
marker, both of which its parser would also read as a call but which would not
trigger the grammar.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass

from xgrammar.structural_tag import (
    ConstStringFormat,
    Format,
    JSONSchemaFormat,
    RegexFormat,
    SequenceFormat,
    TagFormat,
    TagsWithSeparatorFormat,
    TriggeredTagsFormat,
)

from engine.chat.tool_parsers import glm, hermes, kimi_k2
from engine.grammar.schema_bounds import bound_numbers
from engine.grammar.spec import ToolCallConstraint, ToolSchema

_KIMI_MARKERS = (
    *kimi_k2.SECTION_BEGINS,
    *kimi_k2.SECTION_ENDS,
    kimi_k2.CALL_BEGIN,
    kimi_k2.ARGUMENT_BEGIN,
    kimi_k2.CALL_END,
)
# Longest run of whitespace allowed between JSON tokens. Unbounded runs let a
# weak model loop on newlines until max_tokens; 16 still allows indentation.
MAX_JSON_WHITESPACE = 16


def json_format(
    schema: dict | bool, excludes: tuple[str, ...] = (), style: str = "json"
) -> JSONSchemaFormat:
    return JSONSchemaFormat(
        json_schema=bound_numbers(schema),
        style=style,
        excludes=list(excludes) if excludes and not _bounds_lengths(schema) else [],
        max_whitespace_cnt=MAX_JSON_WHITESPACE,
    )


def _bounds_lengths(node: object) -> bool:
    """Whether any (sub)schema bounds a string's length (see the module doc)."""
    if isinstance(node, dict):
        if "minLength" in node or "maxLength" in node:
            return True
        return any(_bounds_lengths(value) for value in node.values())
    if isinstance(node, list):
        return any(_bounds_lengths(value) for value in node)
    return False


@dataclass(frozen=True)
class _Style(ABC):
    trigger: str  # the marker that opens a call (or a section of calls)
    separator: str  # between consecutive calls
    excludes: tuple[str, ...] = ()  # never in free text (auto mode)

    @abstractmethod
    def call(self, tool: ToolSchema) -> TagFormat:
        """One call to `tool`, from its opening marker to its closing one."""

    def calls(self, tags: list[TagFormat], parallel: bool) -> Format:
        """The whole block of calls: one or more, or exactly one.

        A newline may follow the last call: models write one before their end
        token, and with the separator a newline, forbidding it would force
        every newline into the start of another call.
        """
        return SequenceFormat(
            elements=[
                TagsWithSeparatorFormat(
                    tags=tags,
                    separator=self.separator,
                    at_least_one=True,
                    stop_after_first=not parallel,
                ),
                RegexFormat(pattern=r"\n?"),
            ]
        )

    def auto(self, tags: list[TagFormat], parallel: bool) -> Format:
        return TriggeredTagsFormat(
            triggers=[self.trigger],
            tags=tags,
            excludes=list(self.excludes),
            stop_after_first=not parallel,
        )


class _Hermes(_Style):
    def call(self, tool: ToolSchema) -> TagFormat:
        # json.dumps quotes and escapes the name exactly as the parser's json.loads reads it.
        return TagFormat(
            begin=f'{hermes.CALL_OPEN}\n{{"name": {json.dumps(tool.name)}, "arguments": ',
            content=json_format(tool.parameters, (hermes.CALL_CLOSE,)),
            end=f"}}\n{hermes.CALL_CLOSE}",
        )


class _Glm(_Style):
    def call(self, tool: ToolSchema) -> TagFormat:
        return TagFormat(
            begin=f"{glm.CALL_OPEN}{tool.name}",
            content=json_format(tool.parameters, (glm.VALUE_CLOSE,), style="glm_xml"),
            end=glm.CALL_CLOSE,
        )


class _Kimi(_Style):
    def call(self, tool: ToolSchema) -> TagFormat:
        return TagFormat(
            begin=f"{kimi_k2.CALL_BEGIN}functions.{tool.name}:",
            content=SequenceFormat(
                elements=[
                    RegexFormat(pattern=r"\d{1,4}"),
                    ConstStringFormat(value=kimi_k2.ARGUMENT_BEGIN),
                    json_format(tool.parameters, _KIMI_MARKERS),
                ]
            ),
            end=kimi_k2.CALL_END,
        )

    def _section(self, tags: list[TagFormat], parallel: bool) -> TagFormat:
        return TagFormat(
            begin=kimi_k2.SECTION_BEGINS[0],
            content=TagsWithSeparatorFormat(
                tags=tags, separator="", at_least_one=True, stop_after_first=not parallel
            ),
            end=kimi_k2.SECTION_ENDS[0],
        )

    def calls(self, tags: list[TagFormat], parallel: bool) -> Format:
        return self._section(tags, parallel)

    def auto(self, tags: list[TagFormat], parallel: bool) -> Format:
        # One section holds all of a turn's calls, so a second section is not offered.
        return TriggeredTagsFormat(
            triggers=[self.trigger],
            tags=[self._section(tags, parallel)],
            excludes=list(self.excludes),
            stop_after_first=True,
        )


_STYLES: dict[str, _Style] = {
    "hermes": _Hermes(trigger=hermes.CALL_OPEN, separator="\n"),
    "glm45": _Glm(trigger=glm.CALL_OPEN, separator="\n"),
    "glm47": _Glm(trigger=glm.CALL_OPEN, separator=""),
    "kimi_k2": _Kimi(
        trigger=kimi_k2.SECTION_BEGINS[0],
        separator="",
        excludes=(kimi_k2.CALL_BEGIN, *kimi_k2.SECTION_BEGINS[1:]),
    ),
}


def tool_calls_format(constraint: ToolCallConstraint) -> Format:
    style = _STYLES[constraint.format]
    tags = [style.call(tool) for tool in constraint.tools]
    if constraint.required:
        return style.calls(tags, constraint.parallel)
    return style.auto(tags, constraint.parallel)
