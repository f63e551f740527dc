"""The CPU MLA decode kernel (engine/cpu_kernels/mla_decode.c) against torch's absorbed path.

Tolerances. The kernel sums in float32 and rounds only its output to bf16, so
against torch's `_absorbed` run in float32 over the same stored rows it may
differ by one bf16 rounding of each output (at most 2**-8 of the value) plus
float32 summation order (1e-5 of the largest output, far above what is seen).
torch's own bf16 path also rounds q_lat, the latent output and the product to
bf16: against it the bound is 2**-6 of the largest output (about four bf16
roundings; measured up to 0.007).
"""

from __future__ import annotations

import pytest
import torch

from engine.attention.cpu_backend import CPUAttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.attention.mla import MLADims, _absorbed, mla_attention
from engine.cpu_kernels import library
from engine.cpu_kernels import mla_decode as mla_kernel
from engine.kv.mla_pool import MLALatentPool, MLALayout
from tests.engine.agreement import assert_outputs_agree, teacher_forced
from tests.engine.conftest import count_calls

pytestmark = pytest.mark.skipif(
    bool(library.unavailable()), reason=f"CPU kernels: {library.unavailable()}"
)

ROUNDING = 2.0**-8  # one bf16 rounding, relative to the value
SUMMATION = 1e-5  # float32 order, relative to the largest output
TORCH_BF16 = 2.0**-6  # against torch's bf16 path, relative to the largest output
# Logits of decode steps, kernel against torch, tiny DeepseekV3 (logits within +-4). bf16
# model: the attention outputs differ by bf16 roundings (2**-8 relative) and the logits are
# bf16 (steps of 2**-6 between 2 and 4): 0.125 is eight such steps, 0.047 measured; its
# greedy tokens meet close calls (margins of 0, bf16 ties) at once, so the logits are the
# check there. float32 model: float32 summation order, 2e-6 measured with a bf16 cache,
# 3e-5 with FP8 (a new latent near an e4m3 rounding boundary may round the other way).
DECODE_LOGITS_TOL = {"bfloat16": 0.125, "float32": 1e-4}
LAYER = 1
# (heads, nope, rope, v, lora_rank): the tiny test config's, Kimi's, and widths that
# are not multiples of 16 or 64 (masked tails in every pass) with head counts that leave
# groups of 3 and of 1 in the accumulation's groups of 4 (AVX-512), and that fill one
# register of 8 heads or part of two (AVX2's heads in lanes, mla_attend_lanes.c).
SHAPES = {
    "tiny": (4, 16, 8, 16, 16),
    "tiny_16_heads": (16, 16, 8, 16, 16),
    "kimi": (16, 128, 64, 128, 512),
    "kimi_4_heads": (4, 128, 64, 128, 512),
    "ragged": (3, 24, 8, 12, 40),
    "ragged_5_heads": (5, 24, 8, 12, 40),
    "ragged_11_heads": (11, 24, 8, 12, 40),
}
LENS = [1, 37, 300]


def _decode_step(kv_dtype, shape, lens, dtype=torch.bfloat16, seed=0):
    """A pool whose sequences hold all but their last token at scattered slots (never slot
    0, where padding points), and the decode step that adds the last one, as mla_attention
    takes it: (q_nope, q_rope, latent, k_rope, kv_b, pool, meta, dims). q_nope and q_rope
    are views into one [B, H, nope + rope] tensor, as in the model."""
    heads, nope, rope, v, rank = shape
    gen = torch.Generator().manual_seed(seed)
    layout = MLALayout(num_layers=2, kind="mla", latent_dim=rank + rope, rope_dim=rope)
    pages = 2 * sum(lens) // 16 + 2
    pool = MLALatentPool(layout, pages, 16, kv_dtype)
    order = torch.randperm(pages * 16 - 1, generator=gen) + 1
    starts = torch.tensor([0, *lens]).cumsum(0).tolist()
    contexts = [order[start : start + n] for start, n in zip(starts, lens, strict=False)]
    # One write of every cached token (FP8 scales calibrate on it), then the step's own.
    cached = torch.cat([c[:-1] for c in contexts])
    latent = torch.randn(len(cached), rank, generator=gen).to(dtype)
    pool.write(LAYER, latent, (torch.randn(len(cached), rope, generator=gen) * 3).to(dtype), cached)
    batch = len(lens)
    last = torch.stack([c[-1] for c in contexts])
    meta = AttentionMetadata.build([1] * batch, lens, last, contexts, torch.device("cpu"))
    q = torch.randn(batch, heads, nope + rope, generator=gen).to(dtype)
    kv_b = (torch.randn(heads * (nope + v), rank, generator=gen) * rank**-0.5).to(dtype)
    new_latent = torch.randn(batch, rank, generator=gen).to(dtype)
    new_rope = (torch.randn(batch, rope, generator=gen) * 3).to(dtype)
    dims = MLADims(heads, nope, rope, v, rank)
    return q[..., :nope], q[..., nope:], new_latent, new_rope, kv_b, pool, meta, dims


def _float32_reference(step, scale):
    """torch's absorbed path in float32 over the rows the pool holds (no write)."""
    q_nope, q_rope, _, _, kv_b, pool, meta, dims = step
    rows, latent_factor, rope_factor = pool.gather(LAYER, meta.context_slots, torch.float32)
    out = _absorbed(
        q_nope.float(), q_rope.float(), rows, latent_factor, rope_factor, kv_b.float(), meta,
        dims, scale,
    )  # fmt: skip
    return out.flatten(0, 1)[meta.output_index]


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("threads", [1, 3])
def test_kernel_matches_torch_absorbed(kv_dtype, shape, threads):
    step = _decode_step(kv_dtype, SHAPES[shape], LENS)
    pool, dims = step[5], step[7]
    scale = (dims.nope_dim + dims.rope_dim) ** -0.5
    # torch first: it writes the step's latents, the kernel then writes the same bytes
    torch_bf16 = mla_attention(LAYER, *step, scale, "absorbed")
    stored = pool.storage.clone()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)  # 3 threads: uneven head blocks over one sequence too
    try:
        got = CPUAttentionBackend().mla_decode(LAYER, *step, scale)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(pool.storage, stored)
    want = _float32_reference(step, scale)
    assert got.dtype == torch.bfloat16 and got.shape == (len(LENS), dims.num_heads, dims.v_dim)
    largest = want.abs().max()
    error = (got.float() - want).abs()
    assert (error <= ROUNDING * want.abs() + SUMMATION * largest).all(), error.max()
    assert (got.float() - torch_bf16.float()).abs().max() <= TORCH_BF16 * largest


def test_float32_activations_and_rows_are_float32_exact():
    step = _decode_step("float32", SHAPES["kimi_4_heads"], LENS, dtype=torch.float32)
    got = CPUAttentionBackend().mla_decode(LAYER, *step, 0.1)
    want = _float32_reference(step, 0.1)
    assert got.dtype == torch.float32
    assert (got - want).abs().max() <= SUMMATION * want.abs().max()


def test_padding_slots_past_a_sequence_are_never_read():
    """A NaN row at every padding slot (and everywhere unused) changes nothing."""
    step = _decode_step("bf16", SHAPES["tiny"], [3, 20, 9])
    pool, meta = step[5:7]
    scale = 0.25
    clean = CPUAttentionBackend().mla_decode(LAYER, *step, scale)
    used = torch.zeros(pool.storage.shape[1], dtype=torch.bool)
    for b, n in enumerate(meta.context_lens):
        used[meta.context_slots[b, :n]] = True
    pool.storage[LAYER, ~used] = float("nan")
    assert meta.context_slots[0, 3:].eq(0).all()  # padding points at slot 0, now NaN
    again = CPUAttentionBackend().mla_decode(LAYER, *step, scale)
    assert torch.equal(clean, again)


def test_steps_it_does_not_take_fall_back_to_torch():
    step = _decode_step("bf16", SHAPES["tiny"], [5])
    pool, meta, dims = step[5:]
    backend = CPUAttentionBackend()
    slots = meta.context_slots[0]
    prefill = AttentionMetadata.build([2], [5], slots[3:], [slots], torch.device("cpu"))
    stored = pool.storage.clone()
    assert backend.mla_decode(LAYER, *step[:6], prefill, dims, 0.1) is None
    half = [t.half() for t in step[:5]]  # float16 activations: left to torch
    assert backend.mla_decode(LAYER, *half, pool, meta, dims, 0.1) is None
    assert torch.equal(pool.storage, stored)  # nothing written by a step it left


def test_the_wrapper_refuses_what_does_not_fit():
    q_nope, q_rope, _, _, kv_b, pool, meta, _ = _decode_step("bf16", SHAPES["tiny"], [4, 2])
    args = (pool.storage[LAYER], meta.context_slots, meta.context_lengths(), 1.0, 1.0, 0.1)
    with pytest.raises(ValueError, match="do not fit"):
        mla_kernel.mla_decode(q_nope, q_rope, kv_b[:-1], *args)
    with pytest.raises(ValueError, match="see supports"):
        mla_kernel.mla_decode(q_nope, q_rope, kv_b.float(), *args)
    with pytest.raises(ValueError, match="context_slots"):
        mla_kernel.mla_decode(
            q_nope, q_rope, kv_b, *args[:2], meta.context_lengths()[:1], *args[3:]
        )


@pytest.fixture(scope="module")
def tiny_deepseek_v3(tmp_path_factory):
    from engine.devtools.testing.checkpoints import build_deepseek_v3

    # Both layers dense: a routed MoE turns a bf16 rounding near a routing tie into a
    # different expert, which says nothing about attention.
    return build_deepseek_v3(
        tmp_path_factory.mktemp("mla_kernel") / "deepseek_v3", first_k_dense_replace=2
    )


@pytest.mark.parametrize(
    "dtype, kv",
    [("bfloat16", "bf16"), ("bfloat16", "fp8_e4m3"), ("float32", "bf16"), ("float32", "fp8_e4m3")],
)
def test_a_deepseek_v3_model_decodes_the_same_with_the_kernel(
    tiny_deepseek_v3, dtype, kv, monkeypatch
):
    """16 greedy steps of two prompts with the kernel, then with torch's path, in one engine
    (FP8 scales, calibrated on the first prefill, are the same for both); then the logits
    of the same sequences with their last 16 tokens run as decode steps, both ways."""
    from engine import LLM, SamplingParams

    llm = LLM(str(tiny_deepseek_v3), dtype=dtype, kv_cache_dtype=kv, kv_memory=0.01)
    backend = llm.engine.runner.backend
    assert isinstance(backend, CPUAttentionBackend)
    calls = count_calls(monkeypatch, mla_kernel, "mla_decode")
    params = SamplingParams(max_tokens=16, temperature=0, logprobs=2, ignore_eos=True)
    prompts = [[5, 17, 42, 99, 3, 250, 7], [61, 88, 130, 12, 33, 201, 4, 76, 200, 9, 14, 3] * 4]
    with_kernel = [o.outputs[0] for o in llm.generate(prompts, params)]
    assert len(calls) >= 2 * 15  # two layers, fifteen decode steps
    sequences = [p + o.token_ids for p, o in zip(prompts, with_kernel, strict=True)]
    kernel_logits = teacher_forced(llm, sequences, decoded=16)

    monkeypatch.setattr(backend, "mla_decode", lambda *args: None)  # torch's absorbed path
    llm.engine.prefix_cache.clear()
    without = [o.outputs[0] for o in llm.generate(prompts, params)]
    torch_logits = teacher_forced(llm, sequences, decoded=16)

    decoded = torch.zeros(len(torch_logits), dtype=torch.bool)
    for end in torch.tensor([len(s) for s in sequences]).cumsum(0).tolist():
        decoded[end - 16 : end] = True
    # Prefill never takes the kernel: those rows are the same computation.
    assert torch.equal(kernel_logits[~decoded], torch_logits[~decoded])
    tol = DECODE_LOGITS_TOL[dtype]
    assert (kernel_logits[decoded] - torch_logits[decoded]).abs().max().item() <= tol
    for got, want in zip(with_kernel, without, strict=True):
        compared = assert_outputs_agree(got, want, tol)
        if dtype == "float32":
            assert compared == 16  # no step within 2 * 1e-4 of a tie: every token the same
