"""`resident bench families`: the bytes a decode step reads, the table, the answer without
llama.cpp, and one short run of the command (Resident alone: nothing here needs llama.cpp)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from agent.cli import app
from engine.devtools.benchmarks import family_files
from engine.devtools.benchmarks.decode_bytes import (
    Held,
    decode_bytes,
    engine_held,
    gguf_decode_bytes,
    last_level_cache_bytes,
)
from engine.devtools.benchmarks.families import _best, _measure, format_table
from engine.devtools.benchmarks.families_resident import ResidentSide
from engine.devtools.benchmarks.family_files import locate_llama_cpp, prepare_family
from engine.layers.linear_methods import DenseMethod, MethodLinear


class _PackedBeside(DenseMethod):
    """A method that keeps a packed form of `nbytes` beside the layer's dense weight."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def bytes_beside(self, layer) -> int:
        return self.nbytes


def _linear(rows: int, cols: int, packed: int | None = None) -> MethodLinear:
    layer = MethodLinear(cols, rows, bias=False)
    if packed is not None:
        layer.method = _PackedBeside(packed)
    return layer


def test_engine_decode_bytes_match_a_hand_count():
    """Hidden 32, vocabulary 100, 4 routed experts of which 2 per token, float32 dense."""
    model = nn.Module()
    model.embed_tokens = nn.Embedding(100, 32)
    layer = nn.Module()
    layer.norm = nn.Module()
    layer.norm.weight = nn.Parameter(torch.ones(32))
    layer.o_proj = _linear(32, 32)
    layer.mlp = nn.Module()
    layer.mlp.gate = nn.Module()
    layer.mlp.gate.weight = nn.Parameter(torch.zeros(4, 32))
    layer.mlp.experts = nn.ModuleList(_linear(64, 32, packed=1000) for _ in range(4))
    layer.mlp.shared_experts = _linear(64, 32)
    model.layers = nn.ModuleList([layer])
    model.lm_head = _linear(100, 32, packed=2500)

    hand = (
        32 * 4  # one embedding row
        + 32 * 4  # the norm
        + 32 * 32 * 4  # o_proj, dense
        + 4 * 32 * 4  # the router
        + 4 * 1000 * 2 // 4  # two of four routed experts, packed (their dense copy unread)
        + 64 * 32 * 4  # the shared expert
        + 2500  # the head, packed
    )
    assert decode_bytes(engine_held(model), top_k=2, n_routed=4) == hand

    # MLA attention with latent grids (Kimi's packed k_b/v_b halves of kv_b_proj): decode
    # reads the grids; the dense kv_b_proj it keeps beside them serves prefill only.
    class _LatentGrid:
        nbytes = 700

    attn = nn.Module()
    attn.kv_b_proj = _linear(64, 32)
    attn.packed_bytes = lambda: 0 if attn.latent_grid is None else attn.latent_grid.nbytes
    attn.latent_grid = None
    layer.self_attn = attn
    assert decode_bytes(engine_held(model), top_k=2, n_routed=4) == hand + 64 * 32 * 4
    attn.latent_grid = _LatentGrid()
    assert decode_bytes(engine_held(model), top_k=2, n_routed=4) == hand + 700


def test_gguf_names_count_the_same_way():
    held = [
        Held("token_embd.weight", 100 * 34, rows=100),
        Held("blk.0.attn_q.weight", 640),
        Held("blk.0.ffn_gate_inp.weight", 512),
        Held("blk.0.ffn_gate_exps.weight", 8 * 500),
        Held("blk.0.ffn_down_shexp.weight", 300),
        Held("blk.0.exp_probs_b.bias", 32),
        Held("output.weight", 3400),
    ]
    assert decode_bytes(held, top_k=2, n_routed=8) == 34 + 640 + 512 + 2 * 500 + 300 + 32 + 3400
    # A dense model: no routed experts, everything but the embedding read whole.
    assert decode_bytes(held[:3]) == 34 + 640 + 512


def test_gguf_decode_bytes_reads_the_expert_counts(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(str(path), "glm4moe")
    writer.add_expert_count(4)
    writer.add_expert_used_count(2)
    writer.add_tensor("token_embd.weight", torch.zeros(10, 32).numpy())
    writer.add_tensor("blk.0.ffn_up_exps.weight", torch.zeros(4, 16, 32).numpy())
    writer.add_tensor("output.weight", torch.zeros(10, 32).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_decode_bytes(path) == 32 * 4 + 2 * 16 * 32 * 4 + 10 * 32 * 4


def test_batch_decode_rate_is_the_difference_of_the_best_times():
    samples = [{"first_s": 2.0, "whole_s": 10.0}, {"first_s": 1.5, "whole_s": 12.0}]
    best = _best("batch16", samples)
    assert (best["first_s"], best["whole_s"]) == (1.5, 10.0)
    assert best["tok_s"] == pytest.approx(16 * 128 / 8.5)
    # timed directly (Resident's steps, llama-batched-bench): the best rate
    assert _best("batch16", [{"tok_s": 90.0}, {"tok_s": 95.5}])["tok_s"] == 95.5


def test_llama_batched_bench_gives_the_16_sequence_decode_rate(tmp_path):
    from engine.devtools.benchmarks.families_llama_cpp import LlamaCppSide
    from engine.devtools.benchmarks.family_files import LlamaCpp

    bin_dir = tmp_path / "build" / "bin"
    bin_dir.mkdir(parents=True)
    fake = bin_dir / "llama-batched-bench"
    # what its --output-format jsonl prints, among its log lines
    fake.write_text(
        "#!/bin/sh\necho 'main: n_kv_max = 10496'\n"
        'echo \'{"pp": 512, "tg": 128, "pl": 16, "speed_tg": 82.89}\'\n'
    )
    fake.chmod(0o755)
    side = LlamaCppSide.__new__(LlamaCppSide)  # no llama-bench probe
    side.llama_cpp, side.gguf, side.threads = LlamaCpp(tmp_path), "model.gguf", 2
    side.server_flags, side.facts, side._server = [], {}, None
    assert side.measure("batch16", 0) == {"tok_s": 82.89}
    assert side.facts["batch16_method"] == "llama-batched-bench speed_tg"
    fake.write_text("#!/bin/sh\necho 'failed to load model' >&2\nexit 1\n")
    with pytest.raises(RuntimeError, match="exited 1: failed to load model"):
        side.measure("batch16", 0)


def test_llama_cpp_is_located_or_the_reason_said(tmp_path, monkeypatch):
    monkeypatch.delenv("RESIDENT_LLAMA_CPP", raising=False)
    found, why = locate_llama_cpp(None)
    assert found is None and "--llama-cpp DIR" in why
    assert "has no convert_hf_to_gguf.py" in locate_llama_cpp(str(tmp_path))[1]
    (tmp_path / "convert_hf_to_gguf.py").write_text("")
    monkeypatch.setenv("RESIDENT_LLAMA_CPP", str(tmp_path))
    found, why = locate_llama_cpp(None)
    assert found is None and "llama-quantize is not built" in why
    (tmp_path / "build" / "bin").mkdir(parents=True)
    (tmp_path / "build" / "bin" / "llama-quantize").write_text("")
    found, why = locate_llama_cpp(None)
    assert why is None and found.lacking(("llama-bench", "llama-server")) == [
        "llama-bench",
        "llama-server",
    ]


def _result(llama_cpp: dict, ratios: dict | None = None) -> dict:
    family = {
        "layers": 2,
        "params": 238_646_080,
        "active_params": 87_586_880,
        "gguf": {"path": "m.gguf", "bytes": 186_012_352, "tensor_types": {"F32": 17, "Q4_1": 17}},
        "resident": {
            "one_stream": {"tok_s": 30.0},
            "load": {"load_s": 5.0, "peak_rss_bytes": 2**30, "peak_rss_over_gguf": 5.77},
            "decode_bytes": 75_500_000,
            "read_bandwidth_share": 0.5,
            "copy_bandwidth_share": 0.25,
        },
        "llama_cpp": llama_cpp,
    }
    if ratios is not None:
        family["resident_over_llama_cpp"] = ratios
    machine = {"cpu_model": "Xeon", "cores": 2, "cpu_matrix_isa": "amx"}
    return {
        "rounds": 3,
        "threads": 2,
        "resident_source": "folder",
        "machine": {**machine, "read_bandwidth_bytes_s": 13e9, "copy_bandwidth_bytes_s": 26e9},
        "families": {"glm4_moe": family},
    }


def test_the_table_gives_both_engines_and_the_ratio():
    theirs = {"measured": True, "one_stream": {"tok_s": 20.0}, "decode_bytes": 73_000_000}
    table = format_table(_result(theirs, {"one_stream": 1.5}))
    assert "glm4_moe: 2 layers, 0.24B params, 0.09B active per token" in table
    assert "GGUF 177 MiB (F32 17, Q4_1 17)" in table
    row = next(line for line in table.splitlines() if "1 stream decode tok/s" in line)
    assert row.split()[-3:] == ["30.0", "20.0", "1.50"]
    row = next(line for line in table.splitlines() if "decode MB read/token" in line)
    assert row.split()[-3:] == ["75.5", "73.0", "-"]
    assert "read bandwidth 13.0 GB/s, copy bandwidth 26.0 GB/s" in table
    row = next(line for line in table.splitlines() if "share of read bandwidth" in line)
    assert row.split()[-3:] == ["50%", "-", "-"]
    assert "not measured" not in table


def test_the_table_says_why_llama_cpp_was_not_measured():
    table = format_table(_result({"measured": False, "reason": "no llama.cpp given"}))
    assert "llama.cpp not measured: no llama.cpp given" in table
    row = next(line for line in table.splitlines() if "load to 1st token s" in line)
    assert row.split()[-3:] == ["5.00", "-", "-"]


def test_unknown_names_are_usage_errors():
    result = CliRunner().invoke(app, ["bench", "families", "--families", "mistral"])
    assert result.exit_code == 2, result.output
    assert "unknown mistral" in result.output
    result = CliRunner().invoke(app, ["bench", "families", "--quant", "Q3_K_S"])
    assert result.exit_code == 2 and "--quant: unknown Q3_K_S" in result.output, result.output


def test_a_short_run_measures_resident_alone_without_llama_cpp(tmp_path, monkeypatch):
    monkeypatch.delenv("RESIDENT_LLAMA_CPP", raising=False)
    args = ["bench", "families", "--families", "glm4_moe", "--layers", "1", "--rounds", "1"]
    args += ["--figures", "one_stream", "--workdir", str(tmp_path), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    measured = json.loads(result.output)
    assert measured["machine"]["copy_bandwidth_bytes_s"] > 0
    assert measured["machine"]["read_bandwidth_bytes_s"] > 0
    assert "cpu_matrix_isa" in measured["machine"]
    family = measured["families"]["glm4_moe"]
    assert family["llama_cpp"] == {"measured": False, "reason": family["why_no_gguf"]}
    assert "--llama-cpp DIR" in family["why_no_gguf"]
    resident = family["resident"]
    assert resident["one_stream"]["tok_s"] > 0
    assert resident["kv_cache_dtype"] == "fp8_e4m3"
    # One layer of GLM-4.5's shape (hidden 1280, the dense MLP of 4096, vocabulary 32000):
    # attention and MLP on 4 bits (0.625 bytes a weight), the head on 8 (1.125 bytes).
    attention = 1280 * (2048 + 512 + 512) + 2048 * 1280
    hand = (attention + 3 * 1280 * 4096) * 0.625 + 32000 * 1280 * 1.125
    assert resident["decode_bytes"] == pytest.approx(hand, rel=0.01)

    # A second run reuses the checkpoint its recipe matches.
    def refuse(*args, **kwargs):
        raise AssertionError("the checkpoint was written again")

    monkeypatch.setattr(family_files, "write_realistic_checkpoint", refuse)
    files = prepare_family("glm4_moe", 1, tmp_path, None, "no llama.cpp", threads=2)
    assert str(files.folder) == family["checkpoint"]


def test_a_failed_peer_figure_is_recorded_and_not_asked_again():
    resident = ResidentSide("model", threads=2, top_k=0, n_routed=0)  # starts nothing yet
    resident.measure = lambda figure, round_index: {"tok_s": 10.0 + round_index}
    asked = []

    class Peer:
        name = "llama_cpp"

        def measure(self, figure, round_index):
            asked.append((figure, round_index))
            if figure == "prefill":
                raise RuntimeError("llama-bench -p 2048 -n 0 exited -11")
            return {"tok_s": 5.0}

    samples, errors = _measure([resident, Peer()], ("one_stream", "prefill"), rounds=2)
    assert [s["tok_s"] for s in samples["resident"]["prefill"]] == [10.0, 11.0]
    assert samples["llama_cpp"]["prefill"] == [] and len(samples["llama_cpp"]["one_stream"]) == 2
    assert errors["llama_cpp"] == {"prefill": "llama-bench -p 2048 -n 0 exited -11"}
    assert asked.count(("prefill", 1)) == 0


def test_the_last_level_cache_is_read_from_sysfs(tmp_path):
    for index, (level, size) in enumerate([(1, "48K"), (2, "2048K"), (3, "491520K")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "size").write_text(f"{size}\n")
    assert last_level_cache_bytes(tmp_path) == 491520 * 1024
    assert last_level_cache_bytes(tmp_path / "absent") is None


# issue 41's families at a few MiB (the realistic sizes take minutes to write): the same
# config classes and layer plans, narrower, so a run of the worker stays quick.
_NARROW = dict(
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    num_experts_per_tok=2,
    vocab_size=1024,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=64,
    qk_rope_head_dim=32,
    qk_nope_head_dim=32,
    v_head_dim=32,
)
_NARROW_BY_FAMILY = {
    "glm5": dict(q_lora_rank=128, n_routed_experts=8, index_n_heads=2, index_head_dim=64),
    "kimi_linear": dict(num_local_experts=8, linear_num_heads=4, linear_head_dim=64),
}


def _narrow_families(monkeypatch, index_topk: int) -> None:
    from engine.devtools.testing import realistic_checkpoints

    for family, own in _NARROW_BY_FAMILY.items():
        config_class, model_class, fields = realistic_checkpoints.SHAPES[family]
        fields = {**fields, **_NARROW, **own}
        if family == "glm5":
            fields["index_topk"] = index_topk
        monkeypatch.setitem(
            realistic_checkpoints.SHAPES, family, (config_class, model_class, fields)
        )


def test_the_new_families_have_realistic_sizes_and_layer_plans():
    from engine.devtools.testing.realistic_checkpoints import parameter_shapes, realistic_config

    for family in ("glm5", "kimi_linear"):
        params = sum(torch.Size(shape).numel() for shape in parameter_shapes(family).values())
        assert 1.5e9 < params < 2.0e9, (family, params)
    glm5 = realistic_config("glm5")
    assert (glm5["index_n_heads"], glm5["index_head_dim"], glm5["index_topk"]) == (8, 128, 2048)
    assert [i for i, kind in enumerate(glm5["indexer_types"]) if kind == "full"] == [0, 1, 2, 6, 10]
    plan = realistic_config("kimi_linear")["layer_types"]
    assert [i + 1 for i, kind in enumerate(plan) if kind == "full_attention"] == [4, 8, 12, 14]


def test_long_decode_puts_the_families_side_by_side():
    from engine.devtools.benchmarks.long_decode import compare, table_lines

    def family(rates: dict, per_token: int, state: int = 0) -> dict:
        by_context = {str(c): {"tok_s": r, "samples": [r]} for c, r in rates.items()}
        resident = {"long_decode": {"new": 64, "by_context": by_context}}
        resident["kv_bytes_per_token"] = per_token
        if state:
            resident["recurrent_state_bytes_per_sequence"] = state
        return {"resident": resident}

    result = {
        "sizes": {"long_decode": {"contexts": [8192, 16384], "new": 64}},
        "families": {
            "kimi_k2": family({8192: 10.0, 16384: 5.0}, 8064),
            "glm5": family({8192: 12.0, 16384: 10.0}, 9344),
            "kimi_linear": family({8192: 20.0, 16384: 19.0}, 2304, state=10_000_000),
        },
    }
    compared = compare(result)
    assert compared["contexts"] == [8192, 16384] and compared["baseline"] == "kimi_k2"
    row = compared["families"]["glm5"]["by_context"]["16384"]
    assert row["tok_s_over_kimi_k2"] == 2.0
    assert row["sequence_bytes"] == 16384 * 9344
    linear = compared["families"]["kimi_linear"]["by_context"]["8192"]
    assert linear["sequence_bytes"] == 8192 * 2304 + 10_000_000
    assert linear["sequence_bytes_over_kimi_k2"] == round(linear["sequence_bytes"] / 8192 / 8064, 3)
    table = "\n".join(table_lines(compared))
    assert "kimi_linear: 2304 KV bytes per token, 9.5 MiB recurrent state per sequence" in table


def test_long_decode_refuses_contexts_past_the_models_limit(tmp_path):
    args = ["bench", "families", "--families", "glm5", "--figures", "long_decode"]
    args += ["--contexts", "65536", "--workdir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "max_position_embeddings of 65536" in result.output


def test_glm5_and_kimi_linear_run_resident_alone_with_long_decode(tmp_path, monkeypatch):
    """Both new families written, converted for llama.cpp in the released spelling, and
    measured by Resident from their folders; glm5's top-k below the longer context, so
    that decode reads selected positions."""
    monkeypatch.delenv("RESIDENT_LLAMA_CPP", raising=False)
    _narrow_families(monkeypatch, index_topk=16)
    args = ["bench", "families", "--families", "glm5,kimi_linear", "--layers", "2"]
    args += ["--rounds", "1", "--figures", "long_decode", "--contexts", "8,40", "--threads", "1"]
    args += ["--workdir", str(tmp_path), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    measured = json.loads(result.output)
    assert measured["sizes"]["long_decode"] == {"contexts": [8, 40], "new": 64}
    compared = measured["long_decode"]
    assert compared["contexts"] == [8, 40] and set(compared["families"]) == {"glm5", "kimi_linear"}
    for name, family in measured["families"].items():
        resident = family["resident"]
        assert resident["source"] == "folder"
        assert set(resident["long_decode"]["by_context"]) == {"8", "40"}
        assert all(row["tok_s"] > 0 for row in resident["long_decode"]["by_context"].values())
        assert family["llama_cpp"]["measured"] is False, name
    linear = measured["families"]["kimi_linear"]["resident"]
    # One KDA layer of 4 heads of 64x64 float32, and its convolution's last 3 inputs.
    assert linear["recurrent_state_bytes_per_sequence"] >= 4 * 64 * 64 * 4
    released = json.loads((tmp_path / "kimi_linear-2-layers" / "hf" / "config.json").read_text())
    assert released["linear_attn_config"]["kda_layers"] == [1]
    assert released["linear_attn_config"]["full_attn_layers"] == [2]
