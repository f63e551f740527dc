"""tiktoken ranks files (`tiktoken.model`): one `base64(token bytes) rank` per line.

Read here rather than with `tiktoken.load.load_tiktoken_bpe`, which may copy
the file into a cache directory and says little about a malformed line; a
checkpoint's tokenizer should fail to load with the line that is wrong.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from engine.errors import CheckpointError


def read_ranks(path: Path) -> dict[bytes, int]:
    """token bytes -> rank: ranks 0..n-1, each once, and every single byte present."""
    ranks: dict[bytes, int] = {}
    seen: set[int] = set()
    for number, line in enumerate(path.read_text(encoding="ascii").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token_b64, rank_text = line.split()
            token = base64.b64decode(token_b64, validate=True)
            rank = int(rank_text)
        except (ValueError, binascii.Error) as error:
            raise CheckpointError(
                f"{path}:{number}: expected 'base64 rank', got {line!r}"
            ) from error
        if rank in seen or token in ranks:
            raise CheckpointError(f"{path}:{number}: token or rank {rank} appears twice")
        seen.add(rank)
        ranks[token] = rank
    # Special tokens are numbered from len(ranks), so ranks must be exactly 0..n-1.
    if seen and max(seen) != len(seen) - 1:
        raise CheckpointError(f"{path}: ranks are not 0..{len(seen) - 1} (largest {max(seen)})")
    # Byte-level BPE must be able to fall back to single bytes for any input.
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise CheckpointError(
            f"{path}: {len(missing)} single bytes have no rank (first: {missing[0]})"
        )
    return ranks


def write_ranks(path: Path, ranks: dict[bytes, int]) -> None:
    lines = [
        f"{base64.b64encode(token).decode('ascii')} {rank}"
        for token, rank in sorted(ranks.items(), key=lambda item: item[1])
    ]
    path.write_text("\n".join(lines) + "\n", encoding="ascii")
