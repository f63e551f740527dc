"""The disk tier around `resident serve` and `resident cache`: a restarted server
restores what the last one cached; the flag turns it off; list and clear."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from engine.cli import engine_app
from engine.requests.params import SamplingParams
from engine.server import launch
from engine.server.launch import ServeOptions, build_engine, restore_prefixes, save_prefixes

PROMPT = list(range(3, 3 + 70))
GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def _options(model_dir, **extra) -> ServeOptions:
    return ServeOptions(
        model=str(model_dir), dtype="float32", kv_memory_gib=0.01, max_model_len=512, **extra
    )


async def _generate(engine, request_id: str):
    async for output in engine.generate(PROMPT, GREEDY, request_id):
        last = output
    return last


def test_a_restarted_server_restores_its_cached_prefixes(tiny_llama_dir):
    first = build_engine(_options(tiny_llama_dir))
    try:
        cold = asyncio.run(_generate(first, "a"))
        save_prefixes(first)
    finally:
        first.shutdown()
    second = build_engine(_options(tiny_llama_dir))
    try:
        restore_prefixes(second)
        stats = asyncio.run(second.stats())
        assert stats["cached_tokens"] >= 64
        warm = asyncio.run(_generate(second, "b"))
    finally:
        second.shutdown()
    assert cold.num_cached_tokens == 0
    assert warm.num_cached_tokens == 64
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    off = build_engine(_options(tiny_llama_dir, kv_disk=False))
    try:
        restore_prefixes(off)
        assert asyncio.run(off.stats())["cached_tokens"] == 0
    finally:
        off.shutdown()


def test_the_flag_reaches_the_options(monkeypatch):
    seen = []
    monkeypatch.setattr(launch, "serve", lambda options: seen.append(options))
    runner = CliRunner()
    assert runner.invoke(engine_app, ["serve", "--no-kv-disk"]).exit_code == 0
    assert runner.invoke(engine_app, ["serve"]).exit_code == 0
    assert [o.kv_disk for o in seen] == [False, True]


def test_cache_list_and_clear(tmp_path):
    from engine.kv.disk_tier import DiskTier, PageRecord

    tier = DiskTier(tmp_path, "abc123", budget_bytes=10**6)
    tier.write_meta({"model": "tiny", "kv_cache_dtype": "fp8_e4m3", "page_size": 16})
    tier.put_page(PageRecord(b"k" * 16, b"p" * 16, 0, [1, 2], "", b"x" * 100))
    runner = CliRunner()
    listed = runner.invoke(engine_app, ["cache", "list", "--json", "--dir", str(tmp_path)])
    entry = json.loads(listed.output)["engines"][0]
    assert (entry["model"], entry["pages"]) == ("tiny", 1)
    text = runner.invoke(engine_app, ["cache", "list", "--dir", str(tmp_path)]).output
    assert "tiny" in text and "1 pages" in text
    cleared = runner.invoke(engine_app, ["cache", "clear", "--dir", str(tmp_path)])
    assert cleared.exit_code == 0 and "freed" in cleared.output
    assert (
        "no saved prefix KV"
        in runner.invoke(engine_app, ["cache", "list", "--dir", str(tmp_path)]).output
    )
