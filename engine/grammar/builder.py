"""A StructuredOutput made into an xgrammar Grammar (tokenizer-independent).

Everything is written as one structural tag: the optional reasoning prefix,
then the body (JSON under a schema, any JSON object, a regex, tool calls, or
a JSON answer or calls). Building the Grammar already converts every JSON
schema, so a bad schema fails here, before any request is queued; the server
calls `validate` for that reason and the engine compiles the same Grammar for
its tokenizer (engine.grammar.backend).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

import xgrammar as xgr
from xgrammar.structural_tag import (
    AnyTextFormat,
    Format,
    OptionalFormat,
    OrFormat,
    RegexFormat,
    SequenceFormat,
    StructuralTag,
    TagFormat,
)

from engine.chat.reasoning import THINK_CLOSE, THINK_OPEN
from engine.grammar.schema_support import check_schema
from engine.grammar.spec import GrammarError, StructuredOutput
from engine.grammar.tool_calls import json_format, tool_calls_format

# Layout between `</think>` and the answer: models put a newline or two there.
_AFTER_REASONING = r"[ \n]{0,3}"
# Grammars kept after building, by spec (see build_grammar).
MAX_BUILT = 64
_built: OrderedDict[str, xgr.Grammar] = OrderedDict()
_built_lock = threading.Lock()
# xgrammar prefixes its C++ errors with a time and a source location.
_LOG_PREFIX = re.compile(r"^\s*\[[^\]]*\]\s*\S+:\d+:\s*")


def _clean(error: Exception) -> str:
    lines = [_LOG_PREFIX.sub("", line).strip() for line in str(error).splitlines()]
    return "; ".join(line for line in lines if line) or type(error).__name__


def _reasoning_prefix(mode: str) -> Format | None:
    if mode == "open":
        return TagFormat(begin="", content=AnyTextFormat(), end=THINK_CLOSE)
    if mode == "optional":
        return OptionalFormat(
            content=TagFormat(begin=THINK_OPEN, content=AnyTextFormat(), end=THINK_CLOSE)
        )
    return None


def _body(spec: StructuredOutput) -> Format:
    if spec.regex is not None:
        return RegexFormat(pattern=spec.regex)
    answer = None
    if spec.json_schema is not None:
        answer = json_format(spec.json_schema)
    elif spec.json_object:
        answer = json_format({"type": "object"})
    if spec.tool_calls is None:
        return answer
    calls = tool_calls_format(spec.tool_calls)
    return calls if answer is None else OrFormat(elements=[answer, calls])


def _check_schemas(spec: StructuredOutput) -> None:
    where = spec.source or "schema"
    if spec.json_schema is not None:
        check_schema(spec.json_schema, where)
    if spec.tool_calls is not None:
        for index, tool in enumerate(spec.tool_calls.tools):
            check_schema(tool.parameters, f"tools.{index}.function.parameters")


def structural_tag(spec: StructuredOutput) -> StructuralTag:
    body = _body(spec)
    prefix = _reasoning_prefix(spec.reasoning)
    if prefix is not None:
        body = SequenceFormat(elements=[prefix, RegexFormat(pattern=_AFTER_REASONING), body])
    return StructuralTag(format=body)


def build_grammar(spec: StructuredOutput) -> xgr.Grammar:
    """The grammar for `spec`; GrammarError (a 400 in the server) when it cannot be built.

    The server builds it to validate a request and the engine again to compile
    it, so the last few are kept (converting a schema costs milliseconds).
    """
    key = spec.key()
    with _built_lock:
        grammar = _built.get(key)
        if grammar is not None:
            _built.move_to_end(key)
            return grammar
    _check_schemas(spec)
    try:
        grammar = xgr.Grammar.from_structural_tag(structural_tag(spec))
    except (RuntimeError, ValueError, TypeError) as error:
        # xgrammar reports bad schemas, bad regexes and bad structural tags as these.
        raise GrammarError(
            f"{spec.source or 'structured output'}: {_clean(error)}", param=spec.source
        ) from error
    with _built_lock:
        _built[key] = grammar
        while len(_built) > MAX_BUILT:
            _built.popitem(last=False)
    return grammar


def validate(spec: StructuredOutput) -> None:
    """Raise GrammarError if `spec` cannot become a grammar (no tokenizer needed)."""
    build_grammar(spec)
