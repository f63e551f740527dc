"""FP8 KV scales measured on a body of text rather than on a list of prompts.

`LLM.calibrate_kv_scales` prefills the prompts it is given. Real text (a
repository, a document set) is longer and lumpier than that: many files are
short, a few hold most of the tokens. The texts are laid one after another,
as the agent lays a repository's files into its resident prefix, and the
token stream is cut into windows as long as the requests the server will
see, so the K/V ranges are those of deep positions too. When there are more
windows than the budget allows, they are taken evenly spread over the whole
body, not just its first files. The ranges of the values, not their count,
set the scales, so a few dozen windows are plenty.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from engine.errors import EngineError
from engine.host.cache_root import cache_root
from engine.host.memory_advice import return_free_memory
from engine.kv.pool_base import PagedPoolBase
from engine.kv.prefix_tier_parts import FingerprintFacts, fingerprint_of
from engine.kv.quant import CALIBRATION_MARGIN
from engine.kv.scales import read_scales_file, write_scales_file

log = logging.getLogger(__name__)

# A last slice shorter than this adds almost no positions; it is dropped.
MIN_WINDOW_TOKENS = 16
TEXT_SEPARATOR = "\n\n"
PIECE_CHARS = 16_000  # about 4-5k tokens: under any model's length, so no tokenizer warns


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


def _pieces(text: str, limit: int = PIECE_CHARS) -> list[str]:
    """`text` cut at line ends into pieces of at most about `limit` characters."""
    pieces, current, size = [], [], 0
    for line in text.splitlines(keepends=True):
        if current and size + len(line) > limit:
            pieces.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        pieces.append("".join(current))
    return pieces


def body_tokens(tokenizer, texts: Sequence[str]) -> list[int]:
    """The token ids of the non-blank texts one after another, TEXT_SEPARATOR between.

    Encoded a piece at a time: tokenizers warn (and some refuse) past the
    model's length, and a whole repository is far past it.
    """
    separator = tokenizer.encode(TEXT_SEPARATOR, add_special_tokens=False)
    ids: list[int] = []
    for text in (t for t in texts if t.strip()):
        if ids:
            ids += separator
        for piece in _pieces(text):
            ids += tokenizer.encode(piece, add_special_tokens=False)
    return ids


class _CalibratedEngine(Protocol):
    @property
    def max_model_len(self) -> int: ...
    @property
    def pool(self) -> PagedPoolBase: ...
    @property
    def tensor_parallel(self) -> bool: ...
    @property
    def fingerprint_facts(self) -> FingerprintFacts: ...


class CalibrationTarget(Protocol):
    """What calibration uses of an engine.LLM (which kv, below it, cannot import)."""

    @property
    def engine(self) -> _CalibratedEngine: ...
    @property
    def tokenizer(self) -> Any: ...
    def calibrate_kv_scales(
        self,
        prompts: Sequence[str | list[int]],
        path: str | Path | None = None,
        margin: float | None = None,
        source: str = "calibrated",
    ) -> dict: ...


def calibrate_on_texts(
    llm: CalibrationTarget,
    texts: Sequence[str],
    *,
    window: int = 2048,
    max_windows: int = 32,
    path: str | Path | None = None,
    margin: float | None = None,
    source: str = "calibrated",
) -> dict:
    """Calibrate `llm`'s FP8 KV scales on windows of `texts` (see the module docstring).

    The window is capped so a window plus the one generated token fits the
    model's context. Returns the scales document, with the windows and tokens
    used; with `path` it is also written as a `--kv-scales` file.
    """
    window = min(window, llm.engine.max_model_len - 1)
    tokenizer = llm.tokenizer
    body = body_tokens(tokenizer, texts)
    windows = calibration_windows([body], window, max_windows)
    if not windows:
        raise EngineError(
            f"the texts hold no window of {MIN_WINDOW_TOKENS} tokens or more to calibrate on"
        )
    document = llm.calibrate_kv_scales(windows, path=None, margin=margin, source=source)
    document["windows"] = len(windows)
    document["window_tokens"] = window
    document["calibration_tokens"] = sum(len(ids) for ids in windows)
    document["corpus_tokens"] = len(body)
    if path is not None:
        write_scales_file(path, document)
    return document


# Start-up calibration: a server's first request may be a one-word chat, and
# scales set from it and then frozen clip everything longer. On the default
# model, a first prefill of "hi" took Python perplexity from +0.33% to +948%
# against BF16 KV (docs/FP8_ACCURACY.md). The engine's own source, always
# installed, is code with English docstrings: about what an agent serves.
SAMPLE_SOURCE = "sample"
SAMPLE_WINDOW = 2048
SAMPLE_WINDOWS = 2
_SAMPLE_CHARS = 4 * SAMPLE_WINDOW * SAMPLE_WINDOWS * 3  # ~3-4 characters per token, spare


def builtin_sample_texts() -> list[str]:
    """The engine package's own Python files, sorted, until there is enough text."""
    texts, size = [], 0
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if size >= _SAMPLE_CHARS:
            break
        text = path.read_text(encoding="utf-8")
        texts.append(text)
        size += len(text)
    return texts


def calibrate_without_fixed_scales(llm: CalibrationTarget) -> dict | None:
    """Calibrate an FP8 engine's KV scales on the built-in sample when it has neither
    checkpoint nor file scales, before any request can set them; None otherwise.
    `llm` is an engine.LLM (`LLM.from_engine(engine)` for a bare LLMEngine).

    The sample's scales are a function of the weights and the engine's numerics
    (engine_fingerprint), so the first start writes them to the user cache and later
    starts of the same model read them back instead of prefilling the sample again
    (on a CPU, seconds to tens of seconds of every start)."""
    engine = llm.engine
    pool = engine.pool
    if not pool.is_fp8 or pool.scale_source != "calibrate":
        return None
    if engine.tensor_parallel:
        log.info(
            "tensor parallel: FP8 KV scales are set by the first prefill (the maximum over "
            "the ranks), not a start-up sample; give --kv-scales for fixed ones"
        )
        return None
    cached = sample_scales_path(engine)
    document = _read_cached(cached, pool)
    if document is not None:
        return_free_memory()  # what setting the engine up freed
        return document
    # Seconds to tens of seconds on a CPU: say so, or a first start looks hung.
    log.info(
        "FP8 KV scales: calibrating on a built-in sample (up to %d windows of %d tokens), "
        "once for this model and engine; later starts read them from %s",
        SAMPLE_WINDOWS,
        SAMPLE_WINDOW,
        cached,
    )
    document = calibrate_on_texts(
        llm,
        builtin_sample_texts(),
        window=SAMPLE_WINDOW,
        max_windows=SAMPLE_WINDOWS,
        source=SAMPLE_SOURCE,
    )
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        # Beside the target, then renamed: a start reading it never sees half a file.
        partial = cached.with_suffix(f".{os.getpid()}.partial")
        write_scales_file(partial, document)
        os.replace(partial, cached)
    except OSError as error:
        log.info("the sample's KV scales were not cached (%s): the next start calibrates", error)
    return_free_memory()  # the sample's prefill activations
    return document


def sample_scales_path(engine: _CalibratedEngine) -> Path:
    """Where the built-in sample's scales for this model and these numerics are cached."""
    fingerprint, _ = fingerprint_of(engine.fingerprint_facts, engine.pool.granularity)
    sample = hashlib.sha256("\0".join(builtin_sample_texts()).encode())
    sample.update(f"{SAMPLE_WINDOW}/{SAMPLE_WINDOWS}/{CALIBRATION_MARGIN}".encode())
    return cache_root() / "kv_scales" / f"{fingerprint}-{sample.hexdigest()[:16]}.json"


def _read_cached(path: Path, pool: PagedPoolBase) -> dict | None:
    """The cached sample scales set on the pool, or None (absent, unreadable, or not
    this pool's shape: then the caller calibrates and replaces the file)."""
    if not path.is_file():
        return None
    try:
        scales = read_scales_file(path, pool.layout_kind)
        pool.set_scales(scales.first, scales.second, source=SAMPLE_SOURCE)
        document = json.loads(path.read_text())
    except (EngineError, ValueError, OSError) as error:
        log.warning("ignoring the cached KV scales %s (%s); calibrating again", path, error)
        return None
    log.info(
        "FP8 KV scales of the built-in sample read from %s (calibrated at a first start)", path
    )
    document["cached"] = str(path)
    return document
