"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of
the sequence's last n tokens, anywhere in its context.

An agent's context holds the repository, the conversation and tool outputs;
what a model writes back (an edited file, a function with one line changed, a
test that mirrors another) is mostly already in there. Matching the last n
tokens against that context and copying what came next is a free guess that
is often right for dozens of tokens in a row.

n runs from `max_ngram` down to `min_ngram`, longest first: a longer match
pins down where in the context the model is copying from. The shortest n is
2, not 1: a single token (a comma, an indent) recurs everywhere, so a unigram
guess is mostly wrong, and on a CPU a rejected draft costs more than the
decode step it replaces (and takes its batch off the fused decode path).
The latest occurrence wins: in a copy, that is usually the region being copied.

Lookup is O(1) per step: each sequence keeps an index from n-gram to the
position after its latest occurrence, extended by the tokens appended since
the last proposal, so a 100k-token context is indexed once, not every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sequence import Sequence


@dataclass
class _NGramIndex:
    ngrams: tuple[int, ...]
    # tables[j][gram] = position right after the latest occurrence of gram (length ngrams[j])
    tables: list[dict[tuple[int, ...], int]] = field(default_factory=list)
    indexed: int = 1  # positions i < indexed (continuations) are in the tables

    def __post_init__(self) -> None:
        self.tables = [{} for _ in self.ngrams]

    def extend(self, tokens: list[int]) -> None:
        """Index every n-gram that has a continuation, i.e. ends before the last token."""
        end = len(tokens)
        for i in range(self.indexed, end):
            for n, table in zip(self.ngrams, self.tables, strict=True):
                if i >= n:
                    table[tuple(tokens[i - n : i])] = i
        self.indexed = max(self.indexed, end)

    def lookup(self, tokens: list[int]) -> int | None:
        """Where the continuation of the longest matching suffix starts, if any."""
        end = len(tokens)
        for n, table in zip(self.ngrams, self.tables, strict=True):
            if end >= n:
                found = table.get(tuple(tokens[end - n :]))
                if found is not None:
                    return found
        return None


class PromptLookupProposer:
    name = "prompt_lookup"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.ngrams = tuple(range(max_ngram, min_ngram - 1, -1))

    def _index(self, seq: Sequence) -> _NGramIndex:
        index = seq.draft_state.get(self.name)
        if index is None:
            index = seq.draft_state[self.name] = _NGramIndex(self.ngrams)
        return index

    def propose(self, seq: Sequence, k: int) -> list[int]:
        if k <= 0:
            return []
        tokens = seq.token_ids
        index = self._index(seq)
        index.extend(tokens)
        start = index.lookup(tokens)
        if start is None:
            return []
        draft = tokens[start : start + k]
        # A match that overlaps the suffix (a run, a repeated line) has a continuation
        # shorter than k: keep copying with the same period, as LZ77 copies overlap.
        period = len(tokens) - start
        while len(draft) < k:
            draft.append(draft[len(draft) - period])
        return draft

    def verified(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        pass  # stateless beyond the index, which only ever sees verified tokens

    def release(self, seq: Sequence) -> None:
        seq.draft_state.pop(self.name, None)
