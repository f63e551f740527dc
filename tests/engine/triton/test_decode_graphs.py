"""Decode on fixed buffers (what a CUDA graph replays) against eager decode.

Without a GPU nothing can be captured, so DecodeGraphs runs with
capture=False: the same fixed buffers, pad rows, capacity-planned split
grids and metadata views as a replay, run eagerly. One step's logits must
equal the eager path's (ModelRunner building its tables per step) to
float32 rounding, and greedy tokens must be equal, on dense GQA (FP8 and
BF16 caches), GLM-4.5 MoE and DeepSeek V3 (MLA) models, in batches that pad
up to their bucket and under traffic (mixed steps, prefix hits, preemption,
speculative drafts); MoE models on the fused kernel, as on a GPU. Every step after a bucket's first runs under CaptureHazards, which
names any operation a capture could not hold (a host read, a data-sized
output, host data copied per step).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine import LLM, SamplingParams  # noqa: E402
from engine.devtools.testing.capture_hazards import CaptureHazards  # noqa: E402
from engine.devtools.testing.checkpoints import build_deepseek_v3, build_glm4_moe  # noqa: E402
from engine.devtools.testing.decode_traffic import (  # noqa: E402
    PROMPTS,
    on_fixed_buffers,
    run_traffic,
    traffic_llm,
)
from engine.execution.decode_graphs import (  # noqa: E402
    DecodeGraphs,
    decode_buckets,
    pool_ready,
    scale_key,
)
from engine.execution.decode_inputs import IDS, LENGTHS, POSITIONS, SLOTS, DecodeInputs  # noqa: E402
from engine.models.loader import _use_fused_moe  # noqa: E402
from engine.requests.params import SamplingParams as Params  # noqa: E402
from engine.requests.sequence import ScheduledSequence, Sequence  # noqa: E402

GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)


def test_buckets():
    assert decode_buckets(1) == [1]
    assert decode_buckets(3) == [1, 2, 3]
    assert decode_buckets(8) == [1, 2, 4, 8]
    assert decode_buckets(30) == [1, 2, 4, 8, 16, 24, 30]
    with pytest.raises(ValueError):
        decode_buckets(0)


def _scheduled(tokens: list[int], pages: list[int]) -> ScheduledSequence:
    seq = Sequence("r", list(tokens), Params(max_tokens=4))
    seq.pages = list(pages)
    seq.num_computed_tokens = len(tokens) - 1  # the last token is this step's input
    return ScheduledSequence(seq, 1)


def test_fill_lays_out_one_step_and_pads():
    inputs = DecodeInputs(max_batch=4, max_model_len=64, page_size=4, device=torch.device("cpu"))
    batch = [_scheduled(list(range(10, 16)), [7, 3]), _scheduled([1, 2, 3], [5])]
    inputs.fill(batch, rows=4)
    buf, b = inputs.device_buffer, 4
    assert buf[IDS * b : IDS * b + 4].tolist() == [15, 3, 0, 0]
    assert buf[POSITIONS * b : POSITIONS * b + 4].tolist() == [5, 2, 0, 0]
    # Position 5 is page 1 (page id 3), offset 1; position 2 is page 0 (id 5), offset 2.
    assert buf[SLOTS * b : SLOTS * b + 4].tolist() == [3 * 4 + 1, 5 * 4 + 2, -1, -1]
    assert buf[LENGTHS * b : LENGTHS * b + 4].tolist() == [6, 3, 0, 0]
    tables = inputs.metadata(4)._triton_tables
    assert tables.block_tables[0, :2].tolist() == [7, 3] and tables.block_tables[1, 0] == 5
    assert tables.max_seq_len == 64  # the capacity: the same split grid every replay
    meta = inputs.metadata(2)
    assert meta.decode_only and meta.slot_mapping.tolist() == [13, 22]
    with pytest.raises(ValueError, match="do not fit"):
        inputs.fill(batch * 3, rows=4)


def _tokens(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


def _record_hazards(graphs: DecodeGraphs) -> list[str]:
    """Run each fixed-buffer step after a bucket's first (the warm-up a capture follows)
    under CaptureHazards; returns what they found: what a capture could not hold."""
    found: list[str] = []
    warmed: set[int] = set()
    step = graphs._step

    def recorded(rows: int):
        if rows not in warmed:
            warmed.add(rows)
            return step(rows)
        with CaptureHazards() as hazards:
            out = step(rows)
        found.extend(hazards.found)
        return out

    graphs._step = recorded
    return found


def _check_same_logits(llm: LLM) -> None:
    """One decode step of three sequences, eager and then on the fixed buffers (a bucket
    of 4, one pad row), over the same cache: the same logits to float32 rounding. Tokens
    alone are a weak check on a tiny random model (an attention that misses a key can
    keep every greedy token)."""
    engine = llm.engine
    for prompt in PROMPTS:
        engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    engine.step()  # every prompt prefilled, each samples its first token
    batch = engine.scheduler.schedule()
    assert len(batch) == 3 and all(item.num_tokens == 1 for item in batch)
    runner = engine.runner
    eager = runner.run(batch, set()).sample_logits.clone()
    on_fixed_buffers(llm)
    fixed = runner.run(batch, set()).sample_logits  # rewrites the same K/V at the same slots
    assert runner.graphs.replays == 1
    torch.testing.assert_close(fixed, eager, atol=2e-5, rtol=1e-5)


def _check_same_tokens(path, kv: str, dtype: str = "float32", layer_ops=None):
    def make():
        llm = LLM(
            str(path), dtype=dtype, kv_cache_dtype=kv, attention_backend="triton", kv_memory=0.01
        )
        _use_fused_moe(llm.engine.model)  # the GPU's MoE path (a no-op for dense models)
        if layer_ops is not None:
            llm.engine.model.use_layer_ops(layer_ops)
        return llm

    _check_same_logits(make())
    eager = make()
    expected = _tokens(eager, PROMPTS)
    assert eager.engine.runner.graphs is None  # no GPU: graphs are not set up
    fixed = make()
    graphs = on_fixed_buffers(fixed)
    hazards = _record_hazards(graphs)
    assert _tokens(fixed, PROMPTS) == expected  # 3 sequences in a bucket of 4: one pad row
    assert _tokens(fixed, PROMPTS[:1]) == expected[:1]
    assert graphs.replays >= 2 * (GREEDY.max_tokens - 1)
    assert hazards == []  # no host read, data-sized output or per-step host copy
    return graphs


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_dense_model_same_tokens_on_fixed_buffers(tiny_llama_dir, kv):
    _check_same_tokens(tiny_llama_dir, kv)


def test_gpu_layer_ops_same_tokens_on_fixed_buffers(tiny_llama_dir, monkeypatch):
    """The norm, SwiGLU and rotary kernels a GPU runs (interpreted here) in the step too."""
    from engine.layers import gpu_layer_ops

    monkeypatch.setattr(gpu_layer_ops, "_kernel_device", lambda t: True)
    _check_same_tokens(tiny_llama_dir, "fp8_e4m3", layer_ops=gpu_layer_ops.GPU_LAYER_OPS)


def test_moe_model_same_tokens_on_fixed_buffers(tmp_path):
    _check_same_tokens(build_glm4_moe(tmp_path / "glm"), "fp8_e4m3")


def test_mla_model_same_tokens_on_fixed_buffers(tmp_path):
    graphs = _check_same_tokens(build_deepseek_v3(tmp_path / "ds"), "fp8_e4m3")
    assert graphs.backend.mla_decode_calls > 0


def test_steps_the_graphs_do_not_take(tiny_llama_dir):
    """Prefill, prompt logits and speculative verification stay eager."""
    llm = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        kv_cache_dtype="auto",
        attention_backend="triton",
        kv_memory=0.01,
    )
    graphs = on_fixed_buffers(llm)
    decode = _scheduled([1, 2, 3], [0])
    assert graphs.takes([decode], set())
    assert not graphs.takes([decode], {0})
    prefill = _scheduled([1, 2, 3], [0])
    prefill.seq.num_computed_tokens = 0
    prefill.num_tokens = 3
    assert not graphs.takes([prefill], set())
    draft = _scheduled([1, 2, 3], [0])
    draft.draft = [4]
    assert not graphs.takes([draft], set())
    assert not graphs.takes([decode] * 5, set())  # more than the largest bucket


def test_uncalibrated_fp8_pool_and_changed_scales(tiny_llama_dir):
    llm = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        kv_cache_dtype="fp8_e4m3",
        attention_backend="triton",
        kv_memory=0.01,
    )
    pool = llm.engine.pool
    assert not pool_ready(pool)  # scales are calibrated on each layer's first write
    llm.generate([PROMPTS[0]], GREEDY)
    assert pool_ready(pool)
    before = scale_key(pool)
    pool.k_scale.mul_(1.0)  # an in-place change, as set_scales makes
    assert scale_key(pool) != before


def test_traffic_on_fixed_buffers_gives_eager_tokens(tiny_llama_dir):
    """Mixed, prefix-hit, preempted and speculative steps around the fixed-buffer decode
    steps: every request's tokens as with eager decode alone."""
    expected = run_traffic(traffic_llm(tiny_llama_dir, attention_backend="triton"))
    assert expected.preemptions > 0 and expected.speculative_steps > 0
    fixed = traffic_llm(tiny_llama_dir, attention_backend="triton")
    graphs = on_fixed_buffers(fixed)
    assert run_traffic(fixed).tokens == expected.tokens
    assert graphs.replays > 0
