"""The ids of a tokenizer's named special tokens (bos, eos, pad, unk), as transformers
offers them, for the engine's own tokenizer classes."""

from __future__ import annotations


class NamedTokenIds:
    """Mixed into a tokenizer class that has `bos_token`, `eos_token`, `pad_token` and
    `unk_token` (text or None) and `_named_id(token)`, the id of one of them."""

    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    unk_token: str | None

    def _named_id(self, token: str) -> int | None:
        raise NotImplementedError

    def _id_or_none(self, token: str | None) -> int | None:
        return None if token is None else self._named_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._id_or_none(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id_or_none(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id_or_none(self.pad_token)

    @property
    def unk_token_id(self) -> int | None:
        return self._id_or_none(self.unk_token)
