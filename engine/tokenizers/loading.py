"""The engine's tokenizer for a model folder, loaded without running code from the checkpoint.

Two on-disk forms:

- Kimi K2.x ship `tiktoken.model` (a tiktoken ranks file) and
  `tokenization_kimi.py`; transformers would need trust_remote_code to run
  that file. The engine's own `KimiTokenizer` reads the same files instead.
- Everything else the engine serves (Llama, Qwen2, GLM-4, GLM-4.5/4.6/4.7,
  GGUF conversions) has a `tokenizer.json`, which transformers' fast
  tokenizer reads directly. We go straight to that class rather than through
  AutoTokenizer, because AutoTokenizer first loads config.json with
  AutoConfig, which fails for model types transformers does not know
  (kimi_k2, kimi_k25) and can pick a different class by model type. What it
  made is kept in the cache (engine/tokenizers/snapshot.py), keyed by the
  folder, its tokenizer files and the library versions, so later starts read
  it back without importing transformers.

A folder with neither falls back to AutoTokenizer with code execution
refused and a neutral config, so an unknown model type cannot break it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from engine.errors import CheckpointError
from engine.host.cache_root import cache_root
from engine.tokenizers.kimi import RANKS_FILE, KimiTokenizer
from engine.tokenizers.snapshot import SNAPSHOT_FORMAT, SnapshotTokenizer, take_snapshot

log = logging.getLogger(__name__)
# What transformers reads to make a fast tokenizer from a folder.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
)


def load_tokenizer(model_dir: str | Path):
    """A tokenizer with the Hugging Face interface the engine uses (encode, decode, chat template)."""
    model_dir = Path(model_dir)
    if (model_dir / RANKS_FILE).is_file():
        return KimiTokenizer.from_pretrained(model_dir)
    if (model_dir / "tokenizer.json").is_file():
        return _fast_tokenizer(model_dir)
    from transformers import AutoTokenizer, PretrainedConfig

    try:
        return AutoTokenizer.from_pretrained(
            str(model_dir), config=PretrainedConfig(), trust_remote_code=False
        )
    except (OSError, ValueError) as error:
        raise CheckpointError(
            f"{model_dir}: no tokenizer the engine can read: no tokenizer.json or {RANKS_FILE}, "
            f"and transformers could not load one without running checkpoint code ({error})"
        ) from error


def _fast_tokenizer(model_dir: Path):
    """The folder's fast tokenizer: from its snapshot when one is cached, else made by
    transformers and kept as a snapshot (see engine/tokenizers/snapshot.py)."""
    path = snapshot_path(model_dir)
    if path.is_file():
        try:
            return SnapshotTokenizer(json.loads(path.read_text()))
        except Exception as error:  # noqa: BLE001 - tokenizers raises a bare Exception
            log.warning("ignoring the tokenizer snapshot %s (%s)", path, error)
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    snapshot = take_snapshot(hf)
    try:
        text = json.dumps(snapshot)
    except (TypeError, ValueError):  # an attribute JSON cannot hold: keep transformers'
        snapshot = None
    if snapshot is None:
        return hf
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text)
        os.replace(partial, path)
    except OSError as error:
        log.info("tokenizer snapshot not kept at %s (%s)", path, error)
    # From the JSON, as every later start reads it: the first start behaves as they do.
    return SnapshotTokenizer(json.loads(text))


def snapshot_path(model_dir: Path) -> Path:
    """Where the snapshot of this folder's tokenizer is cached: keyed by the folder, the
    bytes of every file transformers reads for it, and both libraries' versions."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (str(model_dir.resolve()), _version("transformers"), _version("tokenizers")):
        digest.update(part.encode() + b"\0")
    digest.update(f"format {SNAPSHOT_FORMAT}".encode())
    extra = model_dir / "additional_chat_templates"
    names = [*_TOKENIZER_FILES, *sorted(str(p.relative_to(model_dir)) for p in extra.glob("*"))]
    for name in names:
        try:
            data = (model_dir / name).read_bytes()
        except OSError:
            data = b""
            name += " (absent)"
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return cache_root() / "tokenizers" / f"{digest.hexdigest()}.json"


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"
