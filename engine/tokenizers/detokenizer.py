"""Incremental detokenization that never emits half a multi-byte character.

Decoding one token at a time is wrong for byte-level BPE (a character can span
tokens) and for SentencePiece (a token's leading space depends on what comes
before). We decode a short window that starts a few tokens back and emit only
the text beyond what the window's prefix already produced, holding back while
the text ends in U+FFFD (an incomplete UTF-8 sequence).
"""

from __future__ import annotations

REPLACEMENT_CHAR = "\ufffd"
# Tokens of left context kept in the decode window.
CONTEXT_TOKENS = 6


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Add one generated token; return the newly complete text (maybe empty)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = full_text[len(prefix_text) :]
        self.prefix_offset = max(self.read_offset, len(self.ids) - CONTEXT_TOKENS)
        self.read_offset = len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of generation: emit whatever is held back, replacement chars included."""
        if self.read_offset >= len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        delta = full_text[len(prefix_text) :]
        self.read_offset = len(self.ids)
        self.text += delta
        return delta
