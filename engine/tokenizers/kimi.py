"""Kimi K2.x's tokenizer: tiktoken byte-level BPE over `tiktoken.model`, without the checkpoint's code.

A Kimi folder ships `tokenization_kimi.py`, which transformers would only
run with trust_remote_code. We read the same files ourselves: the ranks
file, and the special tokens from `tokenizer_config.json`'s
`added_tokens_decoder` (ids right after the ranks; ids there that it does
not name are `<|reserved_token_ID|>`, as Kimi's code names them). Text is
split with Kimi's own pre-tokenizer pattern: o200k's, plus runs of Han
characters as pieces of their own.

The class offers the part of the Hugging Face tokenizer interface the engine
and server use, with Kimi's behaviour where the two differ: no BOS is added
by `encode`, special tokens written in text are read as special tokens
(unless `split_special_tokens`), decoding never inserts spaces around them,
and an incomplete UTF-8 sequence decodes to U+FFFD (the incremental
detokenizer holds text back while it sees one).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import tiktoken
from tokenizers import AddedToken

from engine.errors import CheckpointError
from engine.tokenizers.byte_pieces import bytes_to_piece, piece_to_bytes
from engine.tokenizers.named_tokens import NamedTokenIds
from engine.tokenizers.ranks import read_ranks
from engine.tokenizers.template_chat import ChatTemplates

RANKS_FILE = "tiktoken.model"

# tokenization_kimi.py's `pat_str`. `&&` is class intersection (letters that are not Han).
KIMI_PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
# Kimi encodes in slices, because tiktoken's regex can exhaust its stack on very
# long inputs and on very long runs without (or of only) whitespace. Slicing
# where Kimi slices keeps the token ids identical to Kimi's own tokenizer.
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _bounded_runs(text: str, max_run: int) -> Iterator[str]:
    """Slices of text with no run of whitespace, or of non-whitespace, longer than max_run."""
    start = run_length = 0
    in_space = text[:1].isspace()
    for i, char in enumerate(text):
        if char.isspace() != in_space:
            in_space = not in_space
            run_length = 1
            continue
        run_length += 1
        if run_length > max_run:
            yield text[start:i]
            start, run_length = i, 1
    yield text[start:]


def _deep_sorted(value: Any) -> Any:
    # Kimi's apply_chat_template sorts tool schemas' keys (recursively) before
    # rendering, so the model saw declarations in that order.
    if isinstance(value, dict):
        return {key: _deep_sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_deep_sorted(item) for item in value]
    return value


class KimiTokenizer(NamedTokenIds, ChatTemplates):
    def __init__(
        self,
        ranks: dict[bytes, int],
        special_tokens: dict[str, int],
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        chat_template: str | dict[str, str] | None = None,
        name_or_path: str = "",
        model_max_length: int | None = None,
    ):
        for name, token in (
            ("bos", bos_token),
            ("eos", eos_token),
            ("pad", pad_token),
            ("unk", unk_token),
        ):
            if token is not None and token not in special_tokens:
                raise CheckpointError(f"{name}_token {token!r} is not one of the special tokens")
        self._encoding = tiktoken.Encoding(
            name=Path(name_or_path).name or "kimi",
            pat_str=KIMI_PATTERN,
            mergeable_ranks=ranks,
            special_tokens=special_tokens,
        )
        self._special_to_id = dict(special_tokens)
        self._id_to_special = {i: token for token, i in special_tokens.items()}
        longest_first = sorted(special_tokens, key=len, reverse=True)
        self._special_pattern = re.compile("|".join(map(re.escape, longest_first)) or "(?!)")
        self.bos_token, self.eos_token = bos_token, eos_token
        self.pad_token, self.unk_token = pad_token, unk_token
        self.chat_template = chat_template
        self.name_or_path = name_or_path
        self.model_max_length = model_max_length

    # ----- loading -----------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> KimiTokenizer:
        model_dir = Path(model_dir)
        ranks = read_ranks(model_dir / RANKS_FILE)
        config_path = model_dir / "tokenizer_config.json"
        if not config_path.is_file():
            raise CheckpointError(f"{model_dir}: {RANKS_FILE} without tokenizer_config.json")
        config = json.loads(config_path.read_text())
        specials = _special_tokens(
            config.get("added_tokens_decoder") or {}, len(ranks), config_path
        )
        return cls(
            ranks,
            specials,
            bos_token=_token_text(config.get("bos_token")),
            eos_token=_token_text(config.get("eos_token")),
            pad_token=_token_text(config.get("pad_token")),
            unk_token=_token_text(config.get("unk_token")),
            chat_template=_read_chat_template(model_dir, config),
            name_or_path=str(model_dir),
            model_max_length=config.get("model_max_length"),
        )

    # ----- encoding and decoding ---------------------------------------------------

    def encode(
        self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False
    ) -> list[int]:
        """Token ids for text. Kimi adds no BOS, so `add_special_tokens` changes nothing."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a string, got {type(text).__name__}")
        ids: list[int] = []
        position = 0
        matches = () if split_special_tokens else self._special_pattern.finditer(text)
        for match in matches:
            ids += self._encode_ordinary(text[position : match.start()])
            ids.append(self._special_to_id[match.group()])
            position = match.end()
        ids += self._encode_ordinary(text[position:])
        return ids

    def _encode_ordinary(self, text: str) -> list[int]:
        ids: list[int] = []
        for start in range(0, len(text), MAX_ENCODE_CHARS):
            for piece in _bounded_runs(text[start : start + MAX_ENCODE_CHARS], MAX_RUN_CHARS):
                ids += self._encoding.encode_ordinary(piece)
        return ids

    def decode(
        self,
        token_ids: int | Iterable[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool
        | None = None,  # accepted for HF callers; Kimi never cleans
    ) -> str:
        """Text for ids; ids outside the vocabulary are dropped, as Hugging Face's fast tokenizers do."""
        ids = self._valid_ids(token_ids)
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._id_to_special]
        return self._encoding.decode(ids, errors="replace")

    def batch_decode(self, sequences: Iterable[Iterable[int]], **kwargs) -> list[str]:
        return [self.decode(ids, **kwargs) for ids in sequences]

    def _valid_ids(self, token_ids: int | Iterable[int]) -> list[int]:
        if isinstance(token_ids, int) or getattr(token_ids, "ndim", None) == 0:
            token_ids = [token_ids]
        n_vocab = self.vocab_size
        return [i for i in map(int, token_ids) if 0 <= i < n_vocab]

    # ----- tokens as strings -------------------------------------------------------

    @cached_property
    def _pieces(self) -> list[str]:
        # Kimi names ordinary tokens by their bytes in GPT-2's printable byte
        # alphabet ("Ġthe"), and special tokens by their text.
        return [
            self._id_to_special.get(i)
            or bytes_to_piece(self._encoding.decode_single_token_bytes(i))
            for i in range(self.vocab_size)
        ]

    @cached_property
    def _piece_to_id(self) -> dict[str, int]:
        return {piece: i for i, piece in enumerate(self._pieces)}

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False):
        single = isinstance(ids, int)
        tokens = [
            self._pieces[i]
            for i in self._valid_ids(ids)
            if not (skip_special_tokens and i in self._id_to_special)
        ]
        return (tokens[0] if tokens else None) if single else tokens

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]):
        if isinstance(tokens, str):
            return self._piece_to_id.get(tokens, self.unk_token_id)
        return [self._piece_to_id.get(token, self.unk_token_id) for token in tokens]

    def convert_tokens_to_string(self, tokens: Iterable[str]) -> str:
        data = b"".join(
            token.encode() if token in self._special_to_id else piece_to_bytes(token)
            for token in tokens
        )
        return data.decode("utf-8", errors="replace")

    def get_vocab(self) -> dict[str, int]:
        return dict(self._piece_to_id)

    @property
    def vocab_size(self) -> int:
        return self._encoding.n_vocab

    def __len__(self) -> int:
        return self.vocab_size

    # ----- special tokens ----------------------------------------------------------

    def _named_id(self, token: str) -> int:
        return self._special_to_id[token]

    @property
    def special_tokens_map(self) -> dict[str, str]:
        named = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "unk_token": self.unk_token,
            "pad_token": self.pad_token,
        }
        return {key: value for key, value in named.items() if value is not None}

    @property
    def all_special_tokens(self) -> list[str]:
        return list(self._special_to_id)

    @property
    def all_special_ids(self) -> list[int]:
        return list(self._special_to_id.values())

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return dict(self._special_to_id)

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        return {
            i: AddedToken(token, special=True, normalized=False)
            for i, token in sorted(self._id_to_special.items())
        }

    # ----- chat --------------------------------------------------------------------

    def template_tools(self, tools: list) -> list:
        return _deep_sorted(tools)

    def __repr__(self) -> str:
        return f"KimiTokenizer({self.name_or_path!r}, vocab_size={self.vocab_size})"


def _special_tokens(decoder: dict, num_ranks: int, path: Path) -> dict[str, int]:
    """Special tokens from added_tokens_decoder; unnamed ids up to the last one are reserved tokens."""
    named: dict[int, str] = {}
    for key, entry in decoder.items():
        token_id, content = int(key), _token_text(entry)
        if not content:
            raise CheckpointError(f"{path}: added token {key} has no content")
        if token_id < num_ranks:
            raise CheckpointError(
                f"{path}: special token {content!r} has id {token_id}, inside the "
                f"{num_ranks} ranks of {RANKS_FILE}; special ids start at {num_ranks}"
            )
        named[token_id] = content
    last = max(named, default=num_ranks - 1)
    specials = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(num_ranks, last + 1)}
    if len(specials) != last + 1 - num_ranks:
        raise CheckpointError(f"{path}: added_tokens_decoder names one token twice")
    return specials


def _read_chat_template(model_dir: Path, config: dict) -> str | dict[str, str] | None:
    # chat_template.jinja wins over tokenizer_config.json, as in transformers.
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        return {entry["name"]: entry["template"] for entry in template}
    return template
