"""FP8 KV scales: per-KV-head scales, calibration (first prefill and prompt set), the scales
file, checkpoint scales, and how the engine and `resident serve` report them."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.attention.deterministic import DeterministicAttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend
from engine.errors import EngineError
from engine.kv.pool import PagedKVPool
from engine.kv.quant import FP8_MAX, dequantize_fp8
from engine.kv.sizing import KVLayout
from engine.server.launch import ServeOptions, check_options, describe_kv, describe_kv_scales

PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 88, 130, 12, 33, 201, 4, 76, 200, 9, 14, 15, 92, 6]
OTHER = [300, 11, 2, 150, 160, 170, 9, 8, 7, 280, 44, 45, 46, 47]
LAYOUT = KVLayout(num_layers=2, kind="gqa", num_kv_heads=2, head_dim=8)


def _pool(per_head: bool) -> PagedKVPool:
    return PagedKVPool(
        LAYOUT, num_pages=4, page_size=4, kv_dtype="fp8_e4m3", per_head_scales=per_head
    )


def _heads_with_different_ranges(tokens: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    k = torch.randn(tokens, 2, 8) * torch.tensor([1.0, 50.0]).view(1, 2, 1)
    v = torch.randn(tokens, 2, 8) * torch.tensor([0.1, 3.0]).view(1, 2, 1)
    return k, v


def test_per_head_calibration_gives_one_scale_per_kv_head():
    pool = _pool(per_head=True)
    k, v = _heads_with_different_ranges()
    pool.write(0, k, v, torch.arange(6))
    k_scale, v_scale = pool.layer_scales(0)
    assert k_scale.shape == (2,) and v_scale.shape == (2,)
    for head in range(2):
        assert k_scale[head].item() == pytest.approx(k[:, head].abs().max().item() * 1.25 / FP8_MAX)
        assert v_scale[head].item() == pytest.approx(v[:, head].abs().max().item() * 1.25 / FP8_MAX)
    assert pool.granularity == "per_head" and pool.calibrated_layers == 1
    assert pool.scales()["k"][1] == [1.0, 1.0]  # layer 1 not written yet
    keys, values, k_factor, v_factor = pool.gather(0, torch.arange(6), torch.float32)
    assert isinstance(k_factor, torch.Tensor) and k_factor.shape == (2,)
    got_k = keys * k_factor.view(1, 2, 1)
    # e4m3: relative error <= 2**-4, plus the subnormal spacing of the head's scale.
    bound = k.abs() * 2**-4 + k_scale.view(1, 2, 1) * 2**-9
    assert bool(((got_k - k).abs() <= bound).all())
    # The small head keeps its precision: with one scale it would be mostly subnormal.
    per_layer = _pool(per_head=False)
    per_layer.write(0, k, v, torch.arange(6))
    keys1, _, k_factor1, _ = per_layer.gather(0, torch.arange(6), torch.float32)
    small = (keys1 * k_factor1 - k)[:, 0].abs().mean()
    assert (got_k - k)[:, 0].abs().mean() < small


def _step(query_lens: list[int], context_lens: list[int]) -> AttentionMetadata:
    slots, start, contexts = [], 0, []
    for q_len, ctx in zip(query_lens, context_lens, strict=True):
        seq = torch.arange(start, start + ctx)
        contexts.append(seq)
        slots.append(seq[ctx - q_len :])
        start += 8
    return AttentionMetadata.build(query_lens, context_lens, torch.cat(slots), contexts, "cpu")


def _reference(q, pool, meta, scale):
    """Attention over explicitly dequantized K and V (float32), one sequence at a time."""
    outs, offset = [], 0
    for b, (q_len, ctx) in enumerate(zip(meta.query_lens, meta.context_lens, strict=True)):
        raw = pool.storage[0].index_select(0, meta.context_slots[b, :ctx])
        k_scale, v_scale = pool.layer_scales(0)
        keys = dequantize_fp8(raw[:, 0], k_scale.view(1, -1, 1))
        values = dequantize_fp8(raw[:, 1], v_scale.view(1, -1, 1))
        queries = q[offset : offset + q_len]
        pos = torch.arange(ctx - q_len, ctx)
        mask = torch.arange(ctx)[None, :] <= pos[:, None]
        out = F.scaled_dot_product_attention(
            queries.transpose(0, 1),
            keys.repeat_interleave(2, 1).transpose(0, 1),
            values.repeat_interleave(2, 1).transpose(0, 1),
            attn_mask=mask,
            scale=scale,
        )
        outs.append(out.transpose(0, 1))
        offset += q_len
    return torch.cat(outs)


@pytest.mark.parametrize("backend", [TorchAttentionBackend(), DeterministicAttentionBackend()])
@pytest.mark.parametrize("lens", [([3, 2], [5, 2]), ([1, 1], [6, 3])])  # prefill, decode
def test_per_head_factors_fold_into_queries_and_output(backend, lens):
    torch.manual_seed(2)
    pool = _pool(per_head=True)
    query_lens, context_lens = lens
    k, v = _heads_with_different_ranges(tokens=16)
    pool.write(0, k, v, torch.arange(16))  # calibrates the per-head scales, fills the context
    meta = _step(query_lens, context_lens)
    total = sum(query_lens)
    q = torch.randn(total, 4, 8)
    new_k, new_v = k[:total] * 0.5, v[:total] * 0.5
    out = backend.forward(0, q, new_k, new_v, pool, meta, 8**-0.5)
    expected = _reference(q, pool, meta, 8**-0.5)
    assert (out - expected).abs().max().item() < 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from engine.devtools.testing.checkpoints import tiny_llama

    return tiny_llama(tmp_path_factory.mktemp("scales") / "llama")


def _llm(model_dir, **kwargs) -> LLM:
    return LLM(str(model_dir), dtype="float32", kv_cache_dtype="fp8_e4m3", **kwargs)


@pytest.mark.parametrize("per_head", [False, True])
def test_calibration_over_a_prompt_set_takes_the_max_and_freezes(model_dir, per_head, tmp_path):
    def layer0(prompts):
        llm = _llm(model_dir, kv_scales_per_head=per_head)
        doc = llm.calibrate_kv_scales(prompts)
        return llm, torch.tensor(doc["k"][0]), torch.tensor(doc["v"][0])

    _, k_a, v_a = layer0([PROMPT])
    _, k_b, v_b = layer0([OTHER])
    llm, k_both, v_both = layer0([PROMPT, OTHER])
    # Layer 0's K and V depend on the tokens only, so the set's scale is the larger one.
    assert torch.allclose(k_both, torch.maximum(k_a, k_b))
    assert torch.allclose(v_both, torch.maximum(v_a, v_b))
    pool = llm.engine.pool
    assert pool.scale_source == "calibrated" and pool.per_head == per_head
    frozen = pool.scales()
    llm.prompt_logits([7, 7, 7, 300, 301] * 5)
    assert pool.scales() == frozen
    path = tmp_path / "scales.json"
    written = llm.save_kv_scales(path)
    assert json.loads(path.read_text()) == written
    assert written["format"] == "resident-kv-scales" and written["kv_rotation"] == "hadamard"
    assert written["granularity"] == ("per_head" if per_head else "per_layer")


def test_calibration_drops_pinned_pages_written_with_the_old_scales(model_dir):
    """A pinned prefix keeps its pin but not its pages: they held bytes quantized
    with the scales calibration replaced, so the next request prefills them."""
    llm = _llm(model_dir, page_size=4)
    params = SamplingParams(max_tokens=1, temperature=0)
    prompt = PROMPT * 2
    llm.generate([prompt], params)  # first prefill: scales set, pages cached
    handle = llm.engine.pin_prefix(prompt)
    assert handle
    llm.calibrate_kv_scales([OTHER * 3])
    again = llm.generate([prompt], params)[0]
    assert again.num_cached_tokens == 0
    assert llm.generate([prompt], params)[0].num_cached_tokens > 0  # cached anew, and pinned
    llm.engine.unpin_prefix(handle)


def test_scales_file_round_trip_and_rotation_check(model_dir, tmp_path):
    path = tmp_path / "scales.json"
    first = _llm(model_dir, kv_rotation="none", kv_scales_per_head=True)
    written = first.calibrate_kv_scales([PROMPT, OTHER], path=path)
    assert written["kv_rotation"] == "none" and written["prompts"] == 2
    # auto takes the file's rotation; per-head scales come back as written.
    second = _llm(model_dir, kv_scales_file=str(path))
    pool = second.engine.pool
    assert second.engine.kv_rotation == "none"
    assert pool.scale_source == "file" and pool.per_head
    assert pool.scales() == {"k": written["k"], "v": written["v"]}
    assert torch.equal(first.prompt_logits(PROMPT), second.prompt_logits(PROMPT))
    with pytest.raises(EngineError, match="measured with kv_rotation none"):
        _llm(model_dir, kv_scales_file=str(path), kv_rotation="hadamard")
    path.write_text(json.dumps({"k": [0.1, 0.2, 0.3], "v": [0.1, 0.2, 0.3]}))
    with pytest.raises(EngineError, match="expected 2"):
        _llm(model_dir, kv_scales_file=str(path))


def _with_checkpoint_scales(model_dir, tmp_path, k_value, v_value):
    from engine.devtools.testing.layouts import copy_checkpoint, read_tensors

    tensors = read_tensors(model_dir)
    for layer in range(2):
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = k_value * (layer + 1)
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = v_value * (layer + 1)
    return copy_checkpoint(model_dir, tmp_path / "with-scales", tensors)


def test_checkpoint_per_head_scales(model_dir, tmp_path):
    path = _with_checkpoint_scales(
        model_dir, tmp_path, torch.tensor([0.01, 0.03]), torch.tensor([0.02, 0.01])
    )
    per_layer = _llm(path)  # auto: checkpoint scales are unrotated, so no rotation
    assert per_layer.engine.kv_rotation == "none"
    assert per_layer.engine.pool.scale_source == "checkpoint"
    scales = per_layer.engine.pool.scales()
    assert scales["k"] == pytest.approx([0.03, 0.06]) and scales["v"] == pytest.approx([0.02, 0.04])
    per_head = _llm(path, kv_scales_per_head=True).engine.pool
    assert per_head.scales()["k"] == [pytest.approx([0.01, 0.03]), pytest.approx([0.02, 0.06])]
    rotated = _llm(path, kv_rotation="hadamard").engine.pool
    assert rotated.scale_source == "calibrate"  # unrotated scales are not used for rotated K/V


def test_stats_and_startup_log_report_the_scales_in_force(model_dir):
    llm = _llm(model_dir, kv_scales_per_head=True)
    stats = llm.engine.stats()
    assert stats["kv_rotation"] == "hadamard"
    scales = stats["kv_scales"]
    assert scales["source"] == "calibrate" and scales["calibrated_layers"] == 0
    assert "rotation hadamard" in describe_kv(stats)
    assert "first prefill" in describe_kv_scales(stats)[0]
    llm.prompt_logits(PROMPT)
    stats = llm.engine.stats()
    assert stats["kv_scales"]["granularity"] == "per_head"
    assert len(stats["kv_scales"]["k"]) == 2 and len(stats["kv_scales"]["k"][0]) == 2
    lines = describe_kv_scales(stats)
    assert lines[0].startswith("KV k scales by layer: [") and len(lines) == 2
    line = describe_kv(stats)
    assert "(per_head)" in line and "layers so far" not in line
    assert llm.stats()["kv_rotation"] == "hadamard"


def test_serve_accepts_rotation_and_checks_the_scales_file(tmp_path):
    assert check_options(ServeOptions(model="m", kv_rotation="hadamard")).kv_rotation == "hadamard"
    with pytest.raises(ValueError, match="no such file"):
        check_options(ServeOptions(model="m", kv_scales_file=str(tmp_path / "missing.json")))
