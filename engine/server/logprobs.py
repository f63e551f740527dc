"""The engine's per-token logprobs in the two shapes OpenAI's API uses.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`.
Completions: parallel lists `tokens`, `token_logprobs`, `top_logprobs`,
`text_offset`, where a prompt's first token (echo) has None for both
logprob fields, since nothing predicts it.
"""

from __future__ import annotations

from typing import Any

from engine.requests.sequence import TokenLogprob


class TokenText:
    """Decodes single tokens, remembering them (a vocabulary repeats a lot)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text


def chat_logprobs(entries: list[TokenLogprob], top_n: int, text: TokenText) -> dict:
    def item(token_id: int, logprob: float) -> dict:
        token = text(token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    content = []
    for entry in entries:
        top = sorted(entry.top.items(), key=lambda pair: -pair[1])[:top_n]
        content.append(
            {
                **item(entry.token_id, entry.logprob),
                "top_logprobs": [item(token_id, value) for token_id, value in top],
            }
        )
    return {"content": content}


class CompletionLogprobs:
    """Builds the completions `logprobs` object piece by piece (streaming adds to it)."""

    def __init__(self, text: TokenText, top_n: int, start_offset: int = 0) -> None:
        self.text = text
        self.top_n = top_n
        self.offset = start_offset

    def build(self, entries: list[TokenLogprob | None], token_ids: list[int]) -> dict:
        """One logprobs object for `token_ids`; `entries[i]` is None where nothing predicted it."""
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        for token_id, entry in zip(token_ids, entries, strict=True):
            token = self.text(token_id)
            tokens.append(token)
            offsets.append(self.offset)
            self.offset += len(token)
            if entry is None:
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            token_logprobs.append(entry.logprob)
            top = sorted(entry.top.items(), key=lambda pair: -pair[1])[: self.top_n]
            # logprobs=0 still names the sampled token, as OpenAI's API does.
            pairs = top or [(entry.token_id, entry.logprob)]
            top_logprobs.append({self.text(token_id): value for token_id, value in pairs})
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": offsets,
        }
