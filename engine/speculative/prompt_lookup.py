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

Which occurrence: the copy goes on where it left off. After a verification
the proposer keeps a cursor at the context position that lines up with the
end of the output (where the accepted draft came from, plus the accepted
tokens and the model's own token after them). An occurrence of the suffix
at or shortly after the cursor (within `window` tokens: the model skipped or
replaced a few tokens of what it copies, as in a rename) wins over the
latest one anywhere, which in a file with repeated lines is often the
model's own previous line. Without a cursor, or without an occurrence near
it, the latest occurrence wins: in a copy, that is usually the region being
copied. A suffix that occurs nowhere ends the copy (no cursor until the next
verified draft). Replayed on recorded greedy outputs of the editing benchmark
(bench/prompt_lookup.py, default model), the cursor cut the verifications a
200-token answer needs from 113 to 107 (rename) and 54 to 53 (one-line edit).

Lookup is O(1) per step for the latest occurrence: each sequence keeps an
index from n-gram to the position after its latest occurrence, extended by
the tokens appended since the last proposal, so a 100k-token context is
indexed once, not every step. Occurrences near the cursor come from a list
of positions per shortest n-gram (bisected), checked against the longer n.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from engine.requests.sequence import Sequence


@dataclass
class _NGramIndex:
    ngrams: tuple[int, ...]  # longest first
    # tables[j][gram] = position right after the latest occurrence of gram (length ngrams[j])
    tables: list[dict[tuple[int, ...], int]] = field(default_factory=list)
    # every occurrence of each shortest n-gram: positions right after it, ascending
    positions: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    indexed: int = 1  # positions i < indexed (continuations) are in the tables
    cursor: int | None = None  # context position lined up with the output's end
    source: int | None = None  # where the draft under verification was copied from

    def __post_init__(self) -> None:
        self.tables = [{} for _ in self.ngrams]

    def extend(self, tokens: list[int]) -> None:
        """Index every n-gram that has a continuation, i.e. ends before the last token."""
        end = len(tokens)
        shortest = self.ngrams[-1]
        for i in range(self.indexed, end):
            for n, table in zip(self.ngrams, self.tables, strict=True):
                if i >= n:
                    table[tuple(tokens[i - n : i])] = i
            if i >= shortest:
                self.positions.setdefault(tuple(tokens[i - shortest : i]), []).append(i)
        self.indexed = max(self.indexed, end)

    def _near_cursor(self, tokens: list[int], n: int, window: int) -> int | None:
        """The first occurrence of the last n tokens in [cursor, cursor + window]."""
        shortest = self.ngrams[-1]
        found = self.positions.get(tuple(tokens[len(tokens) - shortest :]), ())
        suffix = tokens[len(tokens) - n :]
        for i in range(bisect.bisect_left(found, self.cursor), len(found)):
            position = found[i]
            if position > self.cursor + window:
                return None
            if position >= n and tokens[position - n : position] == suffix:
                return position
        return None

    def lookup(self, tokens: list[int], window: int) -> int | None:
        """Where the continuation of the longest matching suffix starts, if any: near
        the cursor if the suffix occurs there, else its latest occurrence."""
        end = len(tokens)
        for n, table in zip(self.ngrams, self.tables, strict=True):
            if end >= n:
                latest = table.get(tuple(tokens[end - n :]))
                if latest is None:
                    continue
                if self.cursor is not None:
                    near = self._near_cursor(tokens, n, window)
                    if near is not None:
                        return near
                return latest
        return None


class PromptLookupProposer:
    name = "prompt_lookup"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2, window: int = 256):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.ngrams = tuple(range(max_ngram, min_ngram - 1, -1))
        self.window = window

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
        start = index.source = index.lookup(tokens, self.window)
        if start is None:
            index.cursor = None  # the model writes something new: the copy it followed ended
            return []
        draft = tokens[start : start + k]
        # A match that overlaps the suffix (a run, a repeated line) has a continuation
        # shorter than k: keep copying with the same period, as LZ77 copies overlap.
        period = len(tokens) - start
        while len(draft) < k:
            draft.append(draft[len(draft) - period])
        return draft

    def verified(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """The output now ends with the accepted draft tokens and the model's own token
        after them: line the cursor up one past where those came from."""
        index = self._index(seq)
        if index.source is not None:
            index.cursor = index.source + num_accepted + 1
            index.source = None

    def release(self, seq: Sequence) -> None:
        seq.draft_state.pop(self.name, None)
