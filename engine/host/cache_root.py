"""The folder the engine keeps what it works out once per machine: RESIDENT_CACHE_DIR, else
the user cache's resident/ (the KV disk tier, FP8 KV scales, tokenizer snapshots)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    override = os.environ.get("RESIDENT_CACHE_DIR")
    if override:
        return Path(override)
    import platformdirs  # only when the variable is unset: a quick start reads no more

    return Path(platformdirs.user_cache_dir("resident"))
