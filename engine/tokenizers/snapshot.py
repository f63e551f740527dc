"""A Hugging Face fast tokenizer as transformers configured it, kept and read back without transformers.

Loading a `tokenizer.json` folder through transformers costs `import
transformers` (0.5 s on a 2-core CPU, most of a later start's tokenizer time)
at every start. What transformers adds over the `tokenizers` library is all
decided at load: the special tokens it adds to the backend when the vocabulary
lacks them, the post-processor it rewrites for `add_bos_token`, the named
special tokens, the chat template. So the first load goes through transformers
and its result is written down (`take_snapshot`): the configured backend's
JSON and those attributes. Later loads rebuild the backend from that JSON and
answer from the recorded attributes (`SnapshotTokenizer`); encode, decode and
token names are the backend's own calls, as in transformers. A tokenizer whose
behaviour lives in transformers' Python instead (a model-specific class,
`split_special_tokens`, decode's clean-up of spaces) gets no snapshot and is
always loaded through transformers.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property
from typing import Any

from tokenizers import AddedToken, Tokenizer

from engine.tokenizers.named_tokens import NamedTokenIds
from engine.tokenizers.template_chat import ChatTemplates

SNAPSHOT_FORMAT = 1
_NAMED = ("bos_token", "eos_token", "unk_token", "pad_token")


def take_snapshot(hf: Any) -> dict | None:
    """What a transformers fast tokenizer is, as JSON data; None when its behaviour
    is not all in its backend and these attributes."""
    from transformers import PreTrainedTokenizerFast

    if type(hf) is not PreTrainedTokenizerFast:  # a subclass may override any method
        return None
    if getattr(hf, "split_special_tokens", False) or _cleans_up_spaces(hf):
        return None
    return {
        "format": SNAPSHOT_FORMAT,
        "backend": hf.backend_tokenizer.to_str(),
        "named": {name: getattr(hf, name) for name in _NAMED},
        "special_tokens_map": dict(hf.special_tokens_map),
        "all_special_tokens": list(hf.all_special_tokens),
        "all_special_ids": [int(i) for i in hf.all_special_ids],
        "chat_template": hf.chat_template,
        "name_or_path": str(hf.name_or_path),
        "model_max_length": hf.model_max_length,
    }


def _cleans_up_spaces(hf: Any) -> bool:
    """Whether decode's clean-up of spaces runs: transformers 5 skips it for BPE models
    unless forced; transformers 4 (no such flag) always runs it when asked."""
    if not getattr(hf, "clean_up_tokenization_spaces", False):
        return False
    bpe = type(hf.backend_tokenizer.model).__name__ == "BPE"
    forced = getattr(
        hf, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", True
    )
    return not bpe or forced


class SnapshotTokenizer(NamedTokenIds, ChatTemplates):
    """The part of transformers' fast-tokenizer interface the engine uses, answered by the
    backend and the snapshot's attributes (see the module docstring)."""

    def __init__(self, snapshot: dict):
        if snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"tokenizer snapshot format {snapshot.get('format')!r}")
        self._backend = Tokenizer.from_str(snapshot["backend"])
        # transformers encodes with truncation and padding off unless asked per call.
        self._backend.no_truncation()
        self._backend.no_padding()
        named = snapshot["named"]
        self.bos_token, self.eos_token = named["bos_token"], named["eos_token"]
        self.unk_token, self.pad_token = named["unk_token"], named["pad_token"]
        self.special_tokens_map: dict[str, Any] = snapshot["special_tokens_map"]
        self.all_special_tokens: list[str] = snapshot["all_special_tokens"]
        self.all_special_ids: list[int] = snapshot["all_special_ids"]
        self.chat_template = snapshot["chat_template"]
        self.name_or_path: str = snapshot["name_or_path"]
        self.model_max_length = snapshot["model_max_length"]

    # ----- encoding and decoding ---------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"encode takes a string, got {type(text).__name__}")
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(
        self,
        token_ids: int | Iterable[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        if isinstance(token_ids, int) or getattr(token_ids, "ndim", None) == 0:
            token_ids = [token_ids]
        ids = [int(i) for i in token_ids]
        text = self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        # transformers 5 ignores a clean-up asked of a BPE model (it would eat real spaces).
        if clean_up_tokenization_spaces and type(self._backend.model).__name__ != "BPE":
            text = _clean_up_spaces(text)
        return text

    def batch_decode(self, sequences: Iterable[Iterable[int]], **kwargs) -> list[str]:
        return [self.decode(ids, **kwargs) for ids in sequences]

    # ----- tokens as strings -------------------------------------------------------

    @cached_property
    def _special_id_set(self) -> frozenset[int]:
        return frozenset(self.all_special_ids)

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        skip = self._special_id_set if skip_special_tokens else frozenset()
        return [self._backend.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]):
        if isinstance(tokens, str):
            return self._token_id(tokens)
        return [self._token_id(token) for token in tokens]

    def _token_id(self, token: str) -> int | None:
        token_id = self._backend.token_to_id(token)
        return self.unk_token_id if token_id is None else token_id

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        decoder = self._backend.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        """The base vocabulary, without added tokens (transformers' meaning)."""
        return self._backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def backend_tokenizer(self) -> Tokenizer:
        return self._backend

    @cached_property
    def as_transformers(self) -> Any:
        """The same tokenizer as a transformers object, for libraries that take only
        those (xgrammar's vocabulary reader); imports transformers on first use."""
        from transformers import PreTrainedTokenizerFast

        named = {name: getattr(self, name) for name in _NAMED if getattr(self, name) is not None}
        return PreTrainedTokenizerFast(
            tokenizer_object=self._backend,
            chat_template=self.chat_template,
            name_or_path=self.name_or_path,
            **named,
        )

    # ----- special tokens ----------------------------------------------------------

    def _named_id(self, token: str) -> int | None:
        # A name outside the vocabulary is unk, as in transformers; unk's own is None.
        token_id = self._backend.token_to_id(token)
        if token_id is None and token != self.unk_token:
            return self.unk_token_id
        return token_id

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        return self._backend.get_added_tokens_decoder()

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return {token.content: i for i, token in sorted(self.added_tokens_decoder.items())}

    def __repr__(self) -> str:
        return f"SnapshotTokenizer({self.name_or_path!r}, vocab_size={self.vocab_size})"


def _clean_up_spaces(text: str) -> str:
    """transformers' `clean_up_tokenization`: no space before punctuation and English
    contractions (meant for WordPiece output)."""
    for spaced, joined in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(spaced, joined)
    return text
