"""Tokenizers the engine reads itself, and chat-template rendering shared by them.

`engine.tokenizers.loading.load_tokenizer` picks between these and transformers
(made once per tokenizer folder, then read back from its snapshot: snapshot.py).
"""

from engine.tokenizers.chat_template import render_chat_template
from engine.tokenizers.kimi import KIMI_PATTERN, RANKS_FILE, KimiTokenizer

__all__ = ["KIMI_PATTERN", "RANKS_FILE", "KimiTokenizer", "render_chat_template"]
