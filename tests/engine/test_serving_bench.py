"""`resident bench serving`: every path it names is measured, a peer over the same HTTP."""

from __future__ import annotations

import httpx

from engine.devtools.benchmarks.served import served
from engine.devtools.benchmarks.serving_paths import format_table, run_serving


def test_serving_bench_measures_every_path_and_a_peer(tiny_llama_dir):
    model = str(tiny_llama_dir)
    with served(model) as peer:  # a second server stands in for llama-server or vLLM
        result = run_serving(model, max_tokens=3, concurrency=3, repeats=1, peer=peer)
        assert httpx.get(f"{peer}/health", timeout=10).status_code == 200
    assert set(result["paths"]) == {"library", "async_engine", "http", "http_whole", "peer"}
    for figures in result["paths"].values():  # the same tokens on every path, EOS ignored
        assert figures["single_tok_s"] > 0 and figures["concurrent_tok_s"] > 0
        assert figures["tokens"] == {"single": 3, "concurrent": 9}
    assert set(result["ratios"]) == {
        "http_over_library",
        "http_whole_over_library",
        "http_whole_over_peer",
        "async_engine_over_library",
        "http_over_peer",
        "async_engine_over_peer",
        "library_over_peer",
    }
    assert result["machine"]["usable_cores"] >= 1 and "cpu_matrix_isa" in result["machine"]
    assert "async_engine" in format_table(result)


def test_the_served_engine_stops_with_the_block(tiny_llama_dir):
    with served(str(tiny_llama_dir)) as url:
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    try:
        httpx.get(f"{url}/health", timeout=2)
    except httpx.HTTPError:
        return
    raise AssertionError("the server still answers after the block")


def test_unknown_paths_are_a_usage_error(tiny_llama_dir):
    from typer.testing import CliRunner

    from agent.cli import app

    args = ["bench", "serving", "--model", str(tiny_llama_dir), "--paths", "library,grpc"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "unknown grpc" in result.output
