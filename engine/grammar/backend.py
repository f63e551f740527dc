"""One grammar compiler per tokenizer, and the compiled grammars it has made.

Building the TokenizerInfo walks the whole vocabulary (a fraction of a second
for 49k tokens, more for Kimi's 160k), so it happens once per tokenizer, on
the first structured request, and is kept for as long as the tokenizer lives.
Compiled grammars are kept in a small LRU keyed by the spec: an agent sends
the same tools on every turn, and compiling them again would cost each turn
some milliseconds of the engine thread.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

import xgrammar as xgr

from engine.grammar.builder import build_grammar
from engine.grammar.matcher import RequestGrammar
from engine.grammar.spec import GrammarError, StructuredOutput
from engine.grammar.vocab import build_tokenizer_info

# Compiled grammars kept per tokenizer (each holds token-mask caches: ~0.1-1 MB).
MAX_COMPILED = 64


class GrammarBackend:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int]):
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted({int(i) for i in stop_token_ids})
        self.info = build_tokenizer_info(tokenizer, vocab_size, self.stop_token_ids)
        # xgrammar's own cache is unbounded; ours below is not.
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self._compiled: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: StructuredOutput) -> xgr.CompiledGrammar:
        key = spec.key()
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._compiled.move_to_end(key)
                return compiled
        grammar = build_grammar(spec)
        try:
            compiled = self.compiler.compile_grammar(grammar)
        except RuntimeError as error:
            raise GrammarError(
                f"the grammar could not be compiled: {error}", spec.source
            ) from error
        with self._lock:
            self._compiled[key] = compiled
            while len(self._compiled) > MAX_COMPILED:
                self._compiled.popitem(last=False)
        return compiled

    def request_grammar(
        self, spec: StructuredOutput, extra_stop_token_ids: Iterable[int] = ()
    ) -> RequestGrammar:
        """A fresh matcher for one request; it may end on the engine's stop tokens and
        the request's own (every token the engine would stop on)."""
        stops = sorted(set(self.stop_token_ids) | {int(i) for i in extra_stop_token_ids})
        return RequestGrammar(self.compile(spec), stops, spec.prefix)


_backends: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_backends_lock = threading.Lock()


def backend_for(tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int]) -> GrammarBackend:
    """The backend for this tokenizer object, built on first use."""
    stops = tuple(sorted({int(i) for i in stop_token_ids}))
    with _backends_lock:
        backend = _backends.get(tokenizer)
        if (
            backend is None
            or backend.vocab_size != vocab_size
            or tuple(backend.stop_token_ids) != stops
        ):
            backend = GrammarBackend(tokenizer, vocab_size, stops)
            _backends[tokenizer] = backend
        return backend


class _VocabularySize(Protocol):
    @property
    def vocab_size(self) -> int: ...


class GrammarVocabulary(Protocol):
    """What a grammar needs of the engine it constrains: its tokenizer, the model's
    vocabulary size (the width of the logits it masks) and the tokens it stops on.
    An LLMEngine has them, and so has its request intake (engine/core/intake.py)."""

    @property
    def tokenizer(self) -> Any: ...
    @property
    def model_config(self) -> _VocabularySize: ...
    @property
    def eos_token_ids(self) -> set[int]: ...


def engine_backend(engine: GrammarVocabulary) -> GrammarBackend:
    """The backend for an engine's tokenizer; GrammarError when the model has none."""
    try:
        return backend_for(
            engine.tokenizer,
            engine.model_config.vocab_size,
            engine.eos_token_ids,
        )
    except ValueError as error:
        raise GrammarError(
            f"constrained decoding is unavailable for this model: {error}"
        ) from error


def precompile(engine: GrammarVocabulary, params: Any) -> None:
    """Build the vocabulary and compile `params.structured` into the caches, so the
    engine thread's `request_grammar` only makes the matcher (AsyncEngine calls this
    from a worker thread)."""
    engine_backend(engine).compile(params.structured)


def request_grammar(engine: GrammarVocabulary, params: Any) -> RequestGrammar:
    """The matcher for a request to `engine` with `params.structured` set.

    Its stop tokens are every token the engine stops on: the model's EOS tokens
    (also under ignore_eos: a grammar that has ended has nothing more to say)
    and the request's stop_token_ids.
    """
    return engine_backend(engine).request_grammar(params.structured, params.stop_token_ids)
