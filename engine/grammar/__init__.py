"""Constrained decoding: outputs that follow a JSON schema, a regex or a tool-call format.

`spec` (plain data, carried by SamplingParams) is all that importing this
package loads; xgrammar comes in with `builder` (spec to grammar), `backend`
(a compiler per tokenizer), `matcher` (one request's state) and `masks`
(applying masks to a batch's logits), when a request first asks for it.
"""

from engine.grammar.spec import (
    GrammarError,
    StructuredOutput,
    ToolCallConstraint,
    ToolSchema,
)

__all__ = ["GrammarError", "StructuredOutput", "ToolCallConstraint", "ToolSchema"]
