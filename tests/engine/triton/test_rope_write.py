"""The fused rotary + Hadamard rotation + KV write kernel (engine/attention/triton/rope_write.py)
against the three steps it replaces, the backend seam, and whole models with it on and off.

The reference is the unfused path: the torch layer op's rotary, `HadamardRotation.product`
(x @ H in float32, cast back to the activation dtype) and engine.kv.quant's quantization.
How close the kernel must be, and why:

- Rotary alone (no rotation) has the same rounding points in both, so q and the stored
  bytes are equal, bit for bit.
- With the rotation both compute the same exact sum E = sum_i x_i s_i c (signs s = ±1,
  c = fp32(1/sqrt(block))) in float32, in different orders: each is within
  (D + 1) u A of E (u = 2^-24, A = sum_i |x_i| c; the standard bound for a sum of D
  products), so they are within 2 (D + 1) u A of each other. Rounded to the activation
  dtype (monotone, each off by at most half a step) two values that close end at most
  `2 (D + 1) u A + one step` apart: equal or adjacent. That is the bound on q.
- K and V are that rounded value quantized, and quantization is monotone: the stored value
  lies between the quantizations of ref - bound and ref + bound, i.e. the reference's byte
  or the next e4m3 value up or down (one e4m3 step) where the reference sits that close to
  a rounding boundary, and the reference's byte everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")

from engine import LLM, SamplingParams  # noqa: E402
from engine.attention.metadata import AttentionMetadata  # noqa: E402
from engine.attention.triton import backend as backend_module  # noqa: E402
from engine.attention.triton.backend import TritonAttentionBackend  # noqa: E402
from engine.attention.triton.rope_write import rope_rotate_write  # noqa: E402
from engine.devtools.testing.checkpoints import build_glm4_moe  # noqa: E402
from engine.kv.pool import PagedKVPool  # noqa: E402
from engine.kv.quant import FP8_MAX, quantize_fp8, scale_from_amax  # noqa: E402
from engine.kv.rotation import HadamardRotation  # noqa: E402
from engine.kv.sizing import KVLayout  # noqa: E402
from engine.layers.layer_ops import TORCH_LAYER_OPS  # noqa: E402
from engine.layers.rotary import RotaryEmbedding, rope_inv_freq  # noqa: E402

POISON = 0xA5  # storage bytes no write in these tests produces
MAX_POSITIONS = 64
UNIT_ROUNDOFF = 2.0**-24


@dataclass(frozen=True)
class Case:
    q_heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    interleaved: bool
    rotate: bool
    pages: str  # "fp8" or a float storage dtype's name
    dtype: torch.dtype = torch.bfloat16
    tokens: int = 7

    def __str__(self) -> str:
        style = "interleaved" if self.interleaved else "neox"
        rotation = "hadamard" if self.rotate else "norotation"
        return (f"{self.q_heads}q{self.kv_heads}kv-d{self.head_dim}r{self.rotary_dim}-{style}-"
                f"{rotation}-{self.pages}-{str(self.dtype)[6:]}-t{self.tokens}")  # fmt: skip


CASES = [
    Case(4, 4, 16, 16, False, True, "fp8"),  # GQA group 1, full rotary
    Case(6, 2, 32, 16, True, True, "fp8"),  # group 3, partial interleaved (GLM-4 dense)
    Case(4, 2, 32, 16, False, True, "bfloat16"),  # partial NeoX (GLM-4.5), BF16 pages
    Case(4, 2, 24, 12, False, True, "fp8"),  # head_dim 24: three Hadamard blocks of 8
    Case(4, 2, 16, 8, True, False, "fp8"),  # no rotation: bit-exact
    Case(2, 1, 32, 32, False, False, "bfloat16", tokens=70),  # the prefill tile (64 tokens)
    Case(4, 2, 128, 64, False, True, "fp8"),  # GLM-4.5's head: 1/sqrt(128) is not exact
    Case(4, 2, 32, 16, False, True, "float32", torch.float32),  # float32 model and pages
    Case(4, 2, 32, 32, True, True, "fp8", torch.float32, tokens=70),
]


def make_rotary(rotary_dim: int, interleaved: bool) -> RotaryEmbedding:
    inv_freq, scaling = rope_inv_freq(rotary_dim, {"rope_theta": 10000.0})
    return RotaryEmbedding(rotary_dim, MAX_POSITIONS, inv_freq, interleaved, scaling)


def unfused(q, k, v, positions, rotary, rotation):
    """The three steps' first two, as the layers run them: torch rotary, then x @ H."""
    q, k, v = q.clone(), k.clone(), v.clone()
    TORCH_LAYER_OPS.rope_(q, positions, rotary, None)
    TORCH_LAYER_OPS.rope_(k, positions, rotary, None)
    if rotation is not None:
        q, k, v = (rotation.product(t) for t in (q, k, v))
    return q, k, v


def rotation_bound(pre: torch.Tensor, rotated: torch.Tensor, rotation) -> torch.Tensor:
    """How far the kernel's rotated values may be from the reference's (module docstring):
    2 (D + 1) u sum_i |x_i| |h_i| plus one step of the activation dtype at the larger value."""
    if rotation is None:
        return torch.zeros(rotated.shape, dtype=torch.float64)
    dim = rotation.dim
    magnitude = pre.double().abs() @ rotation.matrix().double().abs()
    step = torch.nextafter(rotated.abs(), torch.tensor(float("inf"), dtype=rotated.dtype))
    step = (step.double() - rotated.abs().double()) * 2  # the larger value's step, at most 2x
    return 2 * (dim + 1) * UNIT_ROUNDOFF * magnitude + step


def per_head_scales(x: torch.Tensor) -> torch.Tensor:
    """Calibrated per-KV-head scales, the last head's 4x too small so that its values saturate."""
    scales = scale_from_amax(x.float().abs().amax(dim=(0, 2)))
    scales[-1] /= 4
    return scales


def poisoned_storage(slots: int, case: Case) -> torch.Tensor:
    dtype = torch.uint8 if case.pages == "fp8" else getattr(torch, case.pages)
    storage = torch.empty(slots, 2, case.kv_heads, case.head_dim, dtype=dtype)
    storage.view(torch.uint8).fill_(POISON)
    return storage


def stored_as_expected(stored, reference, bound, case: Case, scales) -> None:
    """stored [n, heads, D] (bytes or floats) against the reference values of this dtype:
    exact without a bound, else between what reference -/+ bound would store."""
    if case.pages == "fp8":
        scale = scales.view(-1, 1)

        def store(x):
            return quantize_fp8(x, scale).view(torch.uint8)

        def value(raw):
            return raw.view(torch.float8_e4m3fn).double()
    else:

        def store(x):
            return x.to(stored.dtype)

        def value(raw):
            return raw.double()

    if not bool(bound.any()):
        assert torch.equal(stored, store(reference))
        return
    ref = reference.double()
    low, high = value(store((ref - bound).float())), value(store((ref + bound).float()))
    got = value(stored)
    assert bool(((got >= low) & (got <= high)).all())
    if stored.dtype != torch.float32:  # a coarser grid than float32's: boundaries are rare
        assert (got != value(store(reference.float()))).float().mean() < 0.05


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel_matches_the_three_steps(case, seed):
    tokens, hq, hkv, dim = case.tokens, case.q_heads, case.kv_heads, case.head_dim
    qkv = (torch.randn(tokens, hq + 2 * hkv, dim) * 2).to(case.dtype)
    qkv[:, :, 1] *= 8  # an outlier channel, as real keys have
    q, k, v = qkv.split([hq, hkv, hkv], dim=1)  # strided views, read in place
    positions = torch.randint(0, MAX_POSITIONS, (tokens,))
    rotary = make_rotary(case.rotary_dim, case.interleaved)
    rotation = HadamardRotation(dim) if case.rotate else None
    num_slots = tokens + 6
    slots = torch.randperm(num_slots)[:tokens]
    slots[torch.randperm(tokens)[:2]] = -1  # padding tokens
    storage = poisoned_storage(num_slots, case)

    ref_q, ref_k, ref_v = unfused(q, k, v, positions, rotary, rotation)
    fp8 = case.pages == "fp8"
    k_scales, v_scales = (per_head_scales(ref_k), per_head_scales(ref_v)) if fp8 else (None, None)
    block = rotation.block if rotation is not None else None
    tables = (rotary.cos, rotary.sin, case.rotary_dim, case.interleaved, block)
    out = rope_rotate_write(q, k, v, positions, *tables, storage, slots, k_scales, v_scales)

    # Rotary on q and k before the rotation (the values the products read).
    roped_q, roped_k, _ = unfused(q, k, v, positions, rotary, None)
    bound_q = rotation_bound(roped_q, ref_q, rotation)
    assert out.dtype == case.dtype and out.shape == q.shape
    if rotation is None:
        assert torch.equal(out, ref_q)
    else:
        assert bool(((out.double() - ref_q.double()).abs() <= bound_q).all())
    real = slots >= 0
    stored = storage[slots[real]]
    for part, ref, pre, scales in ((0, ref_k, roped_k, k_scales), (1, ref_v, v, v_scales)):
        bound = rotation_bound(pre, ref, rotation)[real]
        stored_as_expected(stored[:, part], ref[real], bound, case, scales)
    if fp8:  # the last head's scale is too small for its values: saturated, never NaN
        decoded = stored[:, :, -1].view(torch.float8_e4m3fn).float()
        assert decoded.isfinite().all() and decoded.abs().max() == FP8_MAX
    untouched = torch.ones(num_slots, dtype=torch.bool)
    untouched[slots[real]] = False
    assert (storage[untouched].view(torch.uint8) == POISON).all()  # padding stored nothing


def test_q_is_rotated_and_v_gets_no_rotary(seed):
    """Attention sees what it would unfused: scores q·k equal those of the rotary'd q and k
    (qH·kH = q·k, H orthonormal), so a q left unrotated while k is rotated (or the reverse)
    changes them; and the stored V times H (H H = I) is the input V, which a rotary applied
    to V would change at every position but 0 (all positions here are 1 or more). float32
    activations and pages keep both checks to float32 rounding."""
    tokens, hq, hkv, dim = 5, 4, 2, 32
    qkv = torch.randn(tokens, hq + 2 * hkv, dim)
    q, k, v = qkv.split([hq, hkv, hkv], dim=1)
    positions = torch.arange(1, tokens + 1)
    rotary, rotation = make_rotary(dim, False), HadamardRotation(dim)
    storage = torch.zeros(tokens, 2, hkv, dim)
    slots = torch.arange(tokens)
    out = rope_rotate_write(q, k, v, positions, rotary.cos, rotary.sin, dim, False,
                            rotation.block, storage, slots, None, None)  # fmt: skip

    roped_q, roped_k, _ = unfused(q, k, v, positions, rotary, None)
    group = hq // hkv
    scores = torch.einsum("thd,shd->hts", out, storage[:, 0].repeat_interleave(group, dim=1))
    expected = torch.einsum("thd,shd->hts", roped_q, roped_k.repeat_interleave(group, dim=1))
    torch.testing.assert_close(scores, expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(out, roped_q, atol=1e-2)  # q itself was rotated
    torch.testing.assert_close(storage[:, 1] @ rotation.matrix(), v, atol=1e-5, rtol=1e-5)


def test_bad_inputs_are_clear_errors():
    q, k = torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    rotary = make_rotary(16, False)
    positions, slots = torch.arange(3), torch.arange(3)
    storage = torch.zeros(8, 2, 2, 16, dtype=torch.uint8)
    scales = torch.ones(2)

    def call(**changes):
        args = dict(q=q, k=k, v=k, positions=positions, cos=rotary.cos, sin=rotary.sin,
                    rotary_dim=16, interleaved=False, rotation_block=16, storage=storage,
                    slots=slots, k_scales=scales, v_scales=scales)  # fmt: skip
        return rope_rotate_write(**{**args, **changes})

    with pytest.raises(ValueError, match="FP8 storage needs K and V scales"):
        call(k_scales=None)
    with pytest.raises(ValueError, match="rotary_dim 15 must be even"):
        call(rotary_dim=15)
    with pytest.raises(ValueError, match="rotation block 12"):
        call(rotation_block=12)
    with pytest.raises(ValueError, match="storage must be"):
        call(storage=torch.zeros(8, 2, 4, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="k must be"):
        call(k=torch.randn(3, 2, 8))
    with pytest.raises(ValueError, match="positions must be"):
        call(positions=positions.float())
    with pytest.raises(ValueError, match="slots must be"):
        call(slots=torch.arange(4))
    with pytest.raises(ValueError, match="q must be"):
        call(q=q.double())


# ----- the backend seam ----------------------------------------------------------------


def _torch_write_gqa(storage, slots, k, v, k_scales, v_scales) -> None:
    """kv_write.write_gqa's job with torch's quantization, for the unfused path here: under
    the interpreter the kernel's bare e4m3 cast rounds wrongly (7.87 -> 4.0, DESIGN.md §3),
    so the unfused path would otherwise differ from the fused one by that bug, not by the
    fusion. On a GPU the cast is right and the two writes store the same bytes."""
    real = slots >= 0
    kv = torch.stack((k[real], v[real]), dim=1)
    if storage.dtype == torch.uint8:
        scales = torch.stack((k_scales, v_scales)).view(2, -1, 1)
        kv = quantize_fp8(kv, scales).view(torch.uint8)
    storage.index_copy_(0, slots[real], kv.to(storage.dtype))


@pytest.fixture
def torch_kv_write(monkeypatch):
    monkeypatch.setattr(backend_module, "write_gqa", _torch_write_gqa)


class _Attention:
    """What a GQA layer hands the backend: its rotary, rotation, layer and scale."""

    def __init__(self, dim: int, rotate: bool):
        self.rotary = make_rotary(dim // 2, False)
        self.kv_rotation = HadamardRotation(dim) if rotate else None
        self.layer, self.scale = 1, dim**-0.5


def _step(kv_dtype: str, calibrated: bool = True):
    """A pool holding one 6-token prefill step of 2 sequences, and that step's tensors."""
    hq, hkv, dim, page = 4, 2, 32, 4
    layout = KVLayout(num_layers=2, kind="gqa", num_kv_heads=hkv, head_dim=dim)
    pool = PagedKVPool(layout, 6, page, kv_dtype)
    if calibrated and pool.is_fp8:
        pool.set_scales(torch.full((2,), 0.02), torch.full((2,), 0.01), "test")
    query_lens = [4, 2]
    slots = [torch.arange(0, 4), torch.arange(8, 10)]
    meta = AttentionMetadata.build(query_lens, query_lens, torch.cat(slots), slots, "cpu")
    qkv = torch.randn(6, hq + 2 * hkv, dim)
    positions = torch.tensor([0, 1, 2, 3, 0, 1])
    return pool, meta, qkv.split([hq, hkv, hkv], dim=1), positions


def _layer_steps(backend, attention: _Attention, pool, meta, qkv, positions):
    """GQAAttention.forward's two paths: (fused output or None, unfused output)."""
    q, k, v = qkv
    rotated = backend.rope_rotate_write(attention.layer, q, k, v, positions, attention.rotary,
                                        attention.kv_rotation, pool, meta)  # fmt: skip
    fused = None
    if rotated is not None:
        fused = backend.attend(attention.layer, rotated, pool, meta, attention.scale)
    ref_q, ref_k, ref_v = unfused(q, k, v, positions, attention.rotary, attention.kv_rotation)
    plain = backend.forward(attention.layer, ref_q, ref_k, ref_v, pool, meta, attention.scale)
    return fused, plain


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "float32"])
def test_backend_fused_path_is_the_unfused_step(kv_dtype, seed, torch_kv_write):
    pool, meta, qkv, positions = _step(kv_dtype)
    backend = TritonAttentionBackend()
    fused, plain = _layer_steps(backend, _Attention(32, True), pool, meta, qkv, positions)
    assert backend.rope_write_calls == 1
    # Both wrote the same slots of the same pool, each attention reading its own write:
    # the outputs differ only where a rotated value's float32 rounding moved its e4m3 byte.
    torch.testing.assert_close(fused, plain, atol=1e-3 if pool.is_fp8 else 1e-5, rtol=1e-4)


def test_backend_declines_where_the_fused_path_must_not_run(monkeypatch):
    backend = TritonAttentionBackend()
    attention = _Attention(32, True)

    def declines(pool, meta, qkv, positions, attention=attention) -> bool:
        before = pool.storage.clone()
        q, k, v = qkv
        layer = (attention.rotary, attention.kv_rotation)
        result = backend.rope_rotate_write(attention.layer, q, k, v, positions, *layer, pool, meta)
        return result is None and torch.equal(pool.storage, before)

    assert declines(*_step("fp8_e4m3", calibrated=False))  # the pool calibrates this layer
    pool, meta, qkv, positions = _step("fp8_e4m3")
    pool.observe()
    assert declines(pool, meta, qkv, positions)  # the pool records what is written
    pool.observe(False)
    butterflies = _Attention(32, True)
    butterflies.kv_rotation = HadamardRotation(32, batch_invariant=True)
    assert declines(pool, meta, qkv, positions, butterflies)  # deterministic mode
    odd = _Attention(32, True)
    odd.rotary = make_rotary(32, False)
    odd.rotary.rotary_dim = 34  # wider than the head: GpuLayerOps.rope_ declines it too
    assert declines(pool, meta, qkv, positions, odd)
    backend.fuse_rope_write = False
    assert declines(pool, meta, qkv, positions)
    backend.fuse_rope_write = True
    monkeypatch.setattr(backend_module, "interpreting", lambda: False)
    assert declines(pool, meta, qkv, positions)  # CPU tensors without the interpreter
    assert backend.rope_write_calls == 0


# ----- whole models --------------------------------------------------------------------

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 61, 88], [130, 12, 33, 201, 4, 76, 200, 9, 14, 15, 92]]
GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=4)
# float32 model: the paths differ in the rotation's summation order (float32 ulps), which
# can move a rare K/V value by one e4m3 step.
LOGPROB_TOL = 1e-4


def _generate(path, fused: bool):
    llm = LLM(str(path), dtype="float32", kv_cache_dtype="fp8_e4m3",
              attention_backend="triton", kv_memory=0.01)  # fmt: skip
    backend = llm.engine.runner.backend
    backend.fuse_rope_write = fused
    outputs = [o.outputs[0] for o in llm.generate(PROMPTS, GREEDY)]
    return outputs, backend.rope_write_calls


@pytest.mark.parametrize("family", ["llama", "glm4_moe"])
def test_models_decode_the_same_with_the_fused_path_on_and_off(
    family, tiny_llama_dir, tmp_path, torch_kv_write
):
    """Tiny Llama (fused qkv views, full NeoX rotary) and GLM-4.5 MoE (q/k norms, so q and k
    are separate tensors; partial NeoX rotary), FP8 KV with the default Hadamard rotation:
    the same greedy tokens and logprobs within LOGPROB_TOL with the fused path on and off."""
    path = tiny_llama_dir if family == "llama" else build_glm4_moe(tmp_path / "glm")
    fused, fused_calls = _generate(path, True)
    plain, plain_calls = _generate(path, False)
    assert plain_calls == 0 and fused_calls > 0  # the first prefill calibrates through the pool
    for a, b in zip(fused, plain, strict=True):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert x.top.keys() == y.top.keys()
            for token, logprob in x.top.items():
                assert abs(logprob - y.top[token]) <= LOGPROB_TOL
