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
  (kimi_k2, kimi_k25) and can pick a different class by model type.

A folder with neither falls back to AutoTokenizer with code execution
refused and a neutral config, so an unknown model type cannot break it.
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import CheckpointError
from engine.tokenizers.kimi import RANKS_FILE, KimiTokenizer


def load_tokenizer(model_dir: str | Path):
    """A tokenizer with the Hugging Face interface the engine uses (encode, decode, chat template)."""
    model_dir = Path(model_dir)
    if (model_dir / RANKS_FILE).is_file():
        return KimiTokenizer.from_pretrained(model_dir)
    if (model_dir / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(model_dir))
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
