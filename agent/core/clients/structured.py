"""The tool-call constraint the agent asks of the in-process engine.

A weak model (the default SmolLM2-135M) often opens a tool call and then
writes something no parser can read: JSON cut short, a misspelt tool name,
arguments the tool rejects. Each such call costs the agent a turn (the model
is told what was wrong) and often ends the run. On the local engine the agent
therefore asks for constrained decoding of calls, in the model's own format
(the renderer's parser decides which):

- free text stays free: the model may answer, explain or think as it likes;
- once it writes the format's opening marker (`<tool_call>`, Kimi's
  `<|tool_calls_section_begin|>`), the rest of the call is constrained: a
  tool that exists, arguments that follow that tool's JSON schema, the
  closing marker. A started call always ends valid.

This is the `tool_choice: "auto"` form of engine.grammar's tool-call grammar
(a structural tag triggered by the marker), not "required": forcing a call on
every turn would stop the model from ever giving its final answer. A schema
the grammar cannot enforce leaves the calls unconstrained (logged) rather
than failing the turn; the agent still validates every call before it runs.
"""

from __future__ import annotations

import logging
from typing import Any

from engine.grammar import GrammarError, StructuredOutput

log = logging.getLogger(__name__)


def tool_call_constraint(prompt: Any) -> StructuredOutput | None:
    """The constraint for a rendered prompt (engine.rendering.RenderedChat), or None."""
    if not prompt.tool_parser or not prompt.tools:
        return None
    from engine.grammar.builder import validate  # xgrammar loads only when tools are offered

    try:
        spec = StructuredOutput.for_tool_calls(
            prompt.tool_parser, list(prompt.tools), required=False, source="tools"
        )
        validate(spec)
    except GrammarError as error:
        log.warning("tool calls left unconstrained: %s", error)
        return None
    return spec
