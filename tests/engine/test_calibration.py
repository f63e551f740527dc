"""FP8 KV scales calibrated on a body of text: windowing, the even spread, and that the
scales equal LLM.calibrate_kv_scales on the same windows given as prompts."""

from __future__ import annotations

import json

import pytest

from engine import LLM
from engine.errors import EngineError
from engine.kv.calibration import (
    MIN_WINDOW_TOKENS,
    body_tokens,
    calibrate_on_texts,
    calibration_windows,
)

WORDS = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n    y: int\n"


def test_windows_cut_every_list_and_keep_a_long_enough_tail():
    first, second = list(range(100)), list(range(1000, 1040))
    windows = calibration_windows([first, second], window=32, max_windows=100)
    # 100 = 32 + 32 + 32 + 4 (the 4-token tail is dropped); 40 = 32 + 8 (dropped too).
    assert windows == [first[0:32], first[32:64], first[64:96], second[0:32]]
    short_tail = calibration_windows([list(range(32 + MIN_WINDOW_TOKENS))], 32, 100)
    assert [len(w) for w in short_tail] == [32, MIN_WINDOW_TOKENS]


def test_windows_beyond_the_budget_are_spread_over_the_whole_corpus():
    lists = [[n] * 20 for n in range(10)]  # ten texts, one window each
    picked = calibration_windows(lists, window=20, max_windows=4)
    assert [w[0] for w in picked] == [0, 3, 6, 9]  # first and last text included
    assert [w[0] for w in calibration_windows(lists, 20, 1)] == [5]


def test_window_and_budget_limits_are_errors():
    with pytest.raises(EngineError, match="at least"):
        calibration_windows([[1] * 100], window=MIN_WINDOW_TOKENS - 1, max_windows=4)
    with pytest.raises(EngineError, match="at least one window"):
        calibration_windows([[1] * 100], window=32, max_windows=0)


def _llm(model_dir) -> LLM:
    return LLM(str(model_dir), dtype="float32", kv_cache_dtype="fp8_e4m3")


def test_scales_equal_calibrating_on_the_same_windows_as_prompts(tiny_llama_dir, tmp_path):
    texts = [WORDS * 40, WORDS * 3, "   \n"]
    path = tmp_path / "scales.json"
    llm = _llm(tiny_llama_dir)
    document = calibrate_on_texts(llm, texts, window=4096, max_windows=5, path=path)
    # The tiny model holds 512 positions: windows are capped so one more token fits.
    assert document["window_tokens"] == llm.engine.max_model_len - 1 == 511
    assert json.loads(path.read_text()) == document

    reference = _llm(tiny_llama_dir)
    # The texts one after another (the blank one left out), as the resident prefix lays files.
    ids = [body_tokens(reference.tokenizer, texts)]
    windows = calibration_windows(ids, 511, 5)
    assert all(len(w) == 511 for w in windows[:-1]) and len(windows) == 5
    assert document["windows"] == len(windows) and document["calibration_tokens"] == sum(
        len(w) for w in windows
    )
    assert document["corpus_tokens"] == sum(len(i) for i in ids)
    expected = reference.calibrate_kv_scales(windows)
    assert (document["k"], document["v"]) == (expected["k"], expected["v"])

    served = LLM(str(tiny_llama_dir), dtype="float32", kv_scales_file=str(path))
    assert served.engine.pool.scales() == {"k": document["k"], "v": document["v"]}


def test_texts_without_a_window_are_an_error(tiny_llama_dir):
    with pytest.raises(EngineError, match="no window"):
        calibrate_on_texts(_llm(tiny_llama_dir), ["x", "   "], window=64)


def test_the_body_is_every_text_in_order_encoded_a_piece_at_a_time(tiny_llama_dir):
    tokenizer = _llm(tiny_llama_dir).tokenizer
    long_text = "x = 1\n" * 5000  # 30,000 characters: encoded in two pieces

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    assert body_tokens(tokenizer, ["a = 1\n", " \n", "b = 2\n"]) == (
        encode("a = 1\n") + encode("\n\n") + encode("b = 2\n")
    )
    pieces = long_text[:15_996], long_text[15_996:]  # cut at the last line end within 16,000
    assert body_tokens(tokenizer, [long_text]) == encode(pieces[0]) + encode(pieces[1])


def test_servers_calibrate_on_the_sample_before_any_request(tiny_llama_dir, tmp_path):
    """A first request of one token must not set (and freeze) the scales."""
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    engine = AsyncEngine.open(EngineConfig(model=str(tiny_llama_dir), dtype="float32"))
    engine.shutdown()  # its thread stops; the engine itself is driven directly below
    pool = engine.engine.pool
    assert pool.scale_source == "sample" and pool.calibrated_layers == 2
    before = pool.scales()
    LLM.from_engine(engine.engine).generate([[7]])
    assert pool.scales() == before

    path = tmp_path / "scales.json"
    path.write_text(json.dumps(before))
    fixed = {"model": str(tiny_llama_dir), "dtype": "float32", "kv_rotation": "hadamard"}
    for config in (
        EngineConfig(**fixed, kv_scales_file=str(path)),  # given scales are kept
        EngineConfig(**fixed, kv_cache_dtype="bf16"),  # nothing to calibrate
    ):
        engine = AsyncEngine.open(config)
        try:
            assert engine.engine.pool.scale_source in ("file", "none")
        finally:
            engine.shutdown()


def test_a_short_first_prefill_warns_that_it_sets_the_scales(tiny_llama_dir, caplog):
    with caplog.at_level("WARNING", logger="engine.kv.pool_base"):
        _llm(tiny_llama_dir).generate([[7, 8, 9]])
    assert "first prefill of only 3 tokens" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="engine.kv.pool_base"):
        _llm(tiny_llama_dir).generate([list(range(3, 103))])
    assert "first prefill" not in caplog.text


def test_a_second_start_reads_the_sample_scales_the_first_start_cached(
    tiny_llama_dir, tmp_path, monkeypatch, caplog
):
    """The sample's scales depend on the weights and the numerics only: a later start of
    the same model takes them from the cache, without prefilling the sample."""
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.kv import calibration

    monkeypatch.setenv("RESIDENT_CACHE_DIR", str(tmp_path / "cache"))
    config = EngineConfig(model=str(tiny_llama_dir), dtype="float32")

    def start():
        engine = AsyncEngine.open(config)
        engine.shutdown()
        return engine.engine

    with caplog.at_level("INFO", logger=calibration.__name__):
        first = start()
    cached = calibration.sample_scales_path(first)
    assert cached.is_file() and first.pool.scale_source == "sample"
    # The first start says it calibrates (seconds on a CPU) and where the scales go.
    assert "calibrating on a built-in sample" in caplog.text and str(cached) in caplog.text
    prefills = []
    real = calibration.calibrate_on_texts
    monkeypatch.setattr(
        calibration, "calibrate_on_texts", lambda *a, **k: prefills.append(1) or real(*a, **k)
    )
    second = start()
    assert prefills == []
    assert second.pool.scale_source == "sample" and second.pool.calibrated_layers == 2
    assert second.pool.scales() == first.pool.scales()

    # Other numerics are another entry: a BF16-weights engine calibrates its own.
    other = EngineConfig(model=str(tiny_llama_dir), dtype="bfloat16")
    engine = AsyncEngine.open(other)
    engine.shutdown()
    assert calibration.sample_scales_path(engine.engine) != cached and prefills == [1]


@pytest.mark.parametrize("damage", ["not json", '{"k": [1.0], "v": [1.0]}', '{"k": "x"}'])
def test_a_damaged_cached_entry_is_calibrated_again_and_replaced(
    tiny_llama_dir, tmp_path, monkeypatch, damage
):
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.kv import calibration

    monkeypatch.setenv("RESIDENT_CACHE_DIR", str(tmp_path / "cache"))
    config = EngineConfig(model=str(tiny_llama_dir), dtype="float32")
    engine = AsyncEngine.open(config)
    engine.shutdown()
    good = engine.engine.pool.scales()
    cached = calibration.sample_scales_path(engine.engine)
    cached.write_text(damage)  # one layer's worth, or not scales at all
    engine = AsyncEngine.open(config)
    engine.shutdown()
    assert engine.engine.pool.scales() == good
    assert json.loads(cached.read_text())["source"] == "sample"


def test_an_unwritable_cache_still_starts(tiny_llama_dir, tmp_path, monkeypatch):
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    monkeypatch.setenv("RESIDENT_CACHE_DIR", str(blocked))
    engine = AsyncEngine.open(EngineConfig(model=str(tiny_llama_dir), dtype="float32"))
    engine.shutdown()
    assert engine.engine.pool.scale_source == "sample"
