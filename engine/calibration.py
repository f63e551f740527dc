"""FP8 KV scales measured on a body of text rather than on a list of prompts.

`LLM.calibrate_kv_scales` prefills the prompts it is given. Real text (a
repository, a document set) is longer and lumpier than that: one file may
hold most of the tokens, another a few. This cuts every text's tokens into
windows as long as the requests the server will see, so the K/V ranges are
those of deep positions too, and when there are more windows than the budget
allows, takes them evenly spread over the whole body, not just its first
files. The ranges of the values, not their count, set the scales, so a few
dozen windows are plenty.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine.errors import EngineError
from engine.kv.scales import write_scales_file

# Windows shorter than this add per-file noise (headers, licence lines) and
# almost no positions; the tail of a text is dropped when it is that short.
MIN_WINDOW_TOKENS = 16


def calibration_windows(
    token_lists: Sequence[Sequence[int]], window: int, max_windows: int
) -> list[list[int]]:
    """Consecutive `window`-token slices of every list (a last shorter slice kept when it
    has at least MIN_WINDOW_TOKENS), at most `max_windows` of them, evenly spread."""
    if window < MIN_WINDOW_TOKENS:
        raise EngineError(f"a calibration window needs at least {MIN_WINDOW_TOKENS} tokens")
    if max_windows < 1:
        raise EngineError("calibrate on at least one window")
    windows = [
        list(ids[start : start + window])
        for ids in token_lists
        for start in range(0, len(ids), window)
        if len(ids) - start >= MIN_WINDOW_TOKENS
    ]
    if len(windows) <= max_windows:
        return windows
    if max_windows == 1:
        return [windows[len(windows) // 2]]
    last = len(windows) - 1
    return [windows[round(k * last / (max_windows - 1))] for k in range(max_windows)]


def calibrate_on_texts(
    llm,
    texts: Sequence[str],
    *,
    window: int = 2048,
    max_windows: int = 32,
    path: str | Path | None = None,
    margin: float | None = None,
) -> dict:
    """Calibrate `llm`'s FP8 KV scales on windows of `texts` (see the module docstring).

    The window is capped so a window plus the one generated token fits the
    model's context. Returns the scales document, with the windows and tokens
    used; with `path` it is also written as a `--kv-scales` file.
    """
    window = min(window, llm.engine.max_model_len - 1)
    tokenizer = llm.tokenizer
    token_lists = [
        tokenizer.encode(text, add_special_tokens=False) for text in texts if text.strip()
    ]
    windows = calibration_windows(token_lists, window, max_windows)
    if not windows:
        raise EngineError(
            f"the texts hold no window of {MIN_WINDOW_TOKENS} tokens or more to calibrate on"
        )
    document = llm.calibrate_kv_scales(windows, path=None, margin=margin)
    document["windows"] = len(windows)
    document["window_tokens"] = window
    document["calibration_tokens"] = sum(len(ids) for ids in windows)
    document["corpus_tokens"] = sum(len(ids) for ids in token_lists)
    if path is not None:
        write_scales_file(path, document)
    return document
