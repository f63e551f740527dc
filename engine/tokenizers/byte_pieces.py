"""GPT-2's printable byte alphabet: how byte-level BPE vocabularies spell token bytes as text.

Each byte maps to one printable character (printable Latin-1 bytes to
themselves, the rest to code points from U+0100), so " the" reads "Ġthe".
Hugging Face's tokenizers and Kimi's `get_vocab` name tokens this way.
"""

from __future__ import annotations


def _byte_alphabet() -> list[str]:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    alphabet = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in alphabet:
            alphabet[b] = chr(256 + extra)
            extra += 1
    return [alphabet[b] for b in range(256)]


BYTE_TO_CHAR = _byte_alphabet()
CHAR_TO_BYTE = {char: b for b, char in enumerate(BYTE_TO_CHAR)}


def bytes_to_piece(data: bytes) -> str:
    return "".join(BYTE_TO_CHAR[b] for b in data)


def piece_to_bytes(piece: str) -> bytes:
    """The bytes a piece spells; raises KeyError for a character outside the alphabet."""
    return bytes(CHAR_TO_BYTE[char] for char in piece)
