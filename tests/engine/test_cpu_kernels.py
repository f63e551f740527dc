"""The C kernels for CPU decode against torch references (engine/cpu_kernels)."""

from __future__ import annotations

import pytest
import torch

from engine.attention.cpu_backend import CPUAttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend
from engine.cpu_kernels import library
from engine.cpu_kernels.grid_matmul import grid_matmul, pack_codes
from engine.kv.pool import PagedKVPool
from engine.kv.sizing import KVLayout
from engine.layers.cpu_grid_weights import GridWeight, pack_grid_weights, pack_if_on_grid
from engine.layers.linear_methods import MethodLinear
from tests.engine.agreement import assert_outputs_agree
from tests.engine.conftest import count_calls

pytestmark = pytest.mark.skipif(
    bool(library.unavailable()), reason=f"CPU kernels: {library.unavailable()}"
)
GROUP = 32
# Logits of a float32 model whose attention sums in another order: far inside this.
FLOAT32_LOGITS_TOL = 1e-4


def _quantized_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the kernel computes: x quantized to int8 per group of 32, times the exact weight."""
    groups = x.float().reshape(x.shape[0], -1, GROUP)
    amax = groups.abs().amax(-1, keepdim=True)
    step = amax / 127
    xq = torch.round(groups * torch.where(amax > 0, 127 / amax, 0.0)).clamp(-128, 127)
    return (xq * step).reshape(x.shape) @ weight.double().T.float()


def _grid(rows: int, cols: int, bits: int, gen: torch.Generator):
    levels = 2**bits
    codes = torch.randint(0, levels, (rows, cols // GROUP, GROUP), generator=gen).float()
    # Scales and offsets in half precision, as GGUF blocks store them (the kernel's layout).
    step = (torch.rand(rows, cols // GROUP, 1, generator=gen) * 0.02 + 1e-3).half().float()
    offset = -step * (levels // 2) + torch.randn(rows, cols // GROUP, 1, generator=gen) * 1e-3
    offset = offset.half().float()
    return codes, step, offset, (codes * step + offset).reshape(rows, cols)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows_x", [1, 5, 16, 37])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grid_matmul_is_the_exact_weight_times_int8_activations(bits, rows_x, dtype):
    gen = torch.Generator().manual_seed(bits * 100 + rows_x)
    rows, cols = 40, 96  # 40 rows: two full tiles of 16 and a masked one
    codes, step, offset, weight = _grid(rows, cols, bits, gen)
    packed, scales = pack_codes(codes, step, offset, bits)
    bias = torch.randn(rows, generator=gen)
    x = (torch.randn(rows_x, cols, generator=gen) * 3).to(dtype)
    got = grid_matmul(x.contiguous(), packed, scales, bits, rows, bias)
    assert got.dtype == dtype and got.shape == (rows_x, rows)
    want = _quantized_reference(x, weight) + bias
    # float32 accumulation order only; bf16 output adds its own rounding
    tol = 2e-5 if dtype == torch.float32 else 8e-3
    assert (got.float() - want).abs().max() <= tol * want.abs().max()
    # and int8 activations stay close to the unquantized product
    exact = x.float() @ weight.T + bias
    assert (got.float() - exact).abs().max() <= 0.05 * exact.abs().max()


def test_grid_matmul_of_no_rows_and_bad_input():
    gen = torch.Generator().manual_seed(0)
    codes, step, offset, _ = _grid(16, 64, 4, gen)
    packed, scales = pack_codes(codes, step, offset, 4)
    assert grid_matmul(torch.empty(0, 64), packed, scales, 4, 16, None).shape == (0, 16)
    with pytest.raises(ValueError, match="contiguous float32 or bfloat16"):
        grid_matmul(torch.zeros(2, 64, dtype=torch.float16), packed, scales, 4, 16, None)


def _q4_1(rows, cols, gen):
    step = (torch.rand(rows, cols // GROUP, 1, generator=gen) * 0.02 + 1e-3).half().float()
    low = (-torch.rand(rows, cols // GROUP, 1, generator=gen) * 0.1).half().float()
    q = torch.randint(0, 16, (rows, cols // GROUP, GROUP), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15
    return (step * q + low).reshape(rows, cols)


def _q8_0(rows, cols, gen):
    step = (torch.rand(rows, cols // GROUP, 1, generator=gen) * 0.01 + 1e-4).half().float()
    q = torch.randint(-127, 128, (rows, cols // GROUP, GROUP), generator=gen).float()
    q[..., 0] = 127
    return (step * q).reshape(rows, cols)


@pytest.mark.parametrize("make, grid", [(_q4_1, "4-bit"), (_q8_0, "8-bit")])
def test_checkpoint_grids_pack_for_the_int8_kernel_any_row_count(make, grid):
    gen = torch.Generator().manual_seed(5)
    weight = make(40, 128, gen)  # 40 rows: torch's int4 packer could not take them
    packed = pack_if_on_grid(weight, "int8")
    assert isinstance(packed, GridWeight) and packed.grid == grid
    x = torch.randn(9, 128, generator=gen)
    want = _quantized_reference(x, weight)
    assert (packed.matmul(x) - want).abs().max() <= 2e-5 * want.abs().max()
    assert pack_if_on_grid(torch.randn(40, 128), "int8") is None
    with pytest.raises(ValueError, match="unknown CPU kernel"):
        pack_if_on_grid(weight, "int3")


def test_int8_linear_keeps_its_bias_through_the_cast_and_any_batch_shape():
    gen = torch.Generator().manual_seed(6)
    linear = MethodLinear(128, 48, bias=True)
    with torch.no_grad():
        linear.weight.copy_(_q4_1(48, 128, gen))
        linear.bias.copy_(torch.randn(48, generator=gen))
    weight, bias = linear.weight.detach().clone(), linear.bias.detach().clone()
    report = pack_grid_weights(linear, "int8")
    assert report["4-bit"] == 1
    # the kernel serves every row count: the dense copy is gone
    assert linear.weight.numel() == 0 and report["dropped_bytes"] == 48 * 128 * 2
    linear.bfloat16()  # the engine casts after packing; the kernel keeps float32 bias
    x = torch.randn(2, 3, 128, generator=gen).bfloat16()
    got = linear(x)
    assert got.shape == (2, 3, 48) and got.dtype == torch.bfloat16
    want = _quantized_reference(x.reshape(6, 128), weight) + bias
    assert (got.reshape(6, 48).float() - want).abs().max() <= 1e-2 * want.abs().max()


def _filled_pool(kv_dtype, dtype, heads, dim, lens, gen, per_head=False):
    layout = KVLayout(num_layers=2, kind="gqa", num_kv_heads=heads, head_dim=dim)
    pool = PagedKVPool(layout, 64, 16, kv_dtype, per_head_scales=per_head)
    order = torch.randperm(64 * 16, generator=gen)
    contexts = [order[i * 300 : i * 300 + n] for i, n in enumerate(lens)]
    for layer in range(2):
        for slots in contexts:
            k = (torch.randn(len(slots), heads, dim, generator=gen) * 2).to(dtype)
            v = torch.randn(len(slots), heads, dim, generator=gen).to(dtype)
            pool.write(layer, k, v, slots)
    last = torch.stack([c[-1] for c in contexts])
    meta = AttentionMetadata.build([1] * len(lens), lens, last, contexts, torch.device("cpu"))
    return pool, meta


@pytest.mark.parametrize(
    "kv_dtype, dtype, per_head",
    [
        ("bf16", torch.float32, False),
        ("bf16", torch.bfloat16, False),
        ("fp8_e4m3", torch.float32, False),
        ("fp8_e4m3", torch.bfloat16, False),
        ("fp8_e4m3", torch.float32, True),
        ("float32", torch.float32, False),
    ],
)
@pytest.mark.parametrize("q_heads, kv_heads, dim", [(9, 3, 64), (4, 4, 32), (8, 1, 128)])
def test_paged_decode_matches_the_torch_backend(kv_dtype, dtype, per_head, q_heads, kv_heads, dim):
    gen = torch.Generator().manual_seed(q_heads * dim)
    lens = [1, 17, 100, 33]
    pool, meta = _filled_pool(kv_dtype, dtype, kv_heads, dim, lens, gen, per_head)
    q = torch.randn(len(lens), q_heads, dim, generator=gen).to(dtype)
    for layer in range(2):
        want = TorchAttentionBackend._decode(layer, q, pool, meta, dim**-0.5)
        got = CPUAttentionBackend()._decode(layer, q, pool, meta, dim**-0.5)
        assert got.dtype == dtype and got.shape == want.shape
        tol = 2e-6 if dtype == torch.float32 else 1e-2
        assert (got.float() - want.float()).abs().max() <= tol * want.float().abs().max()


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_a_model_decodes_the_same_tokens_on_the_cpu_backend(tiny_llama_dir, kv, monkeypatch):
    from engine import LLM, SamplingParams
    from engine.attention import cpu_backend

    calls = count_calls(monkeypatch, cpu_backend, "paged_decode")
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=2, ignore_eos=True)
    prompts = [[5, 17, 42, 99, 3, 250, 7], [61, 88, 130, 12, 33, 301, 4, 76, 200, 9, 14]]

    def run(backend):
        llm = LLM(
            str(tiny_llama_dir), dtype="float32", kv_cache_dtype=kv, attention_backend=backend
        )
        assert llm.engine.runner.backend.name == backend
        return [o.outputs[0] for o in llm.generate(prompts, params)]

    expected = run("torch")
    # Both read the same cache and sum in float32 in another order (2e-6 of the output,
    # above): the same tokens wherever that cannot decide (tests/engine/agreement.py).
    for got, want in zip(run("cpu"), expected, strict=True):
        assert assert_outputs_agree(got, want, FLOAT32_LOGITS_TOL)
    assert len(calls) >= 2 * 5  # two layers, five decode steps


def test_cpu_kernel_choice_falls_back_or_says_why(tiny_llama_dir, monkeypatch):
    from engine import LLM
    from engine.errors import EngineError
    from engine.execution import layer_kernels, weight_packing

    for module in (weight_packing, layer_kernels):  # the kernel's choice, the layers' ops
        monkeypatch.setattr(module, "cpu_kernels_unavailable", lambda: "no compiler (test)")
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", kv_cache_dtype="bf16")
    assert llm.engine.cpu_kernel == "bf16"  # auto: torch's kernels
    with pytest.raises(EngineError, match="--cpu-kernel int8 cannot run here: no compiler"):
        LLM(str(tiny_llama_dir), dtype="bfloat16", kv_cache_dtype="bf16", cpu_kernel="int8")


def test_kernels_off_by_environment(monkeypatch):
    library._load.cache_clear()
    monkeypatch.setenv("RESIDENT_CPU_KERNELS", "0")
    try:
        assert library.unavailable() == "RESIDENT_CPU_KERNELS=0"
        with pytest.raises(RuntimeError, match="CPU kernels unavailable"):
            library.library()
    finally:
        library._load.cache_clear()


def test_a_failing_compiler_leaves_the_kernels_off_with_its_message(monkeypatch, tmp_path):
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'cc: error: no such thing' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    library._load.cache_clear()
    try:
        reason = library.unavailable()
        assert reason.startswith("building the CPU kernels failed") and "no such thing" in reason
        assert not list((tmp_path / "cache" / "resident" / "kernels").glob("*.so"))
    finally:
        library._load.cache_clear()


def _awkward_values(shape, gen) -> torch.Tensor:
    """Normal values, tiny ones (FP8 subnormals), huge ones (saturate), exact zeros of both signs."""
    x = torch.randn(shape, generator=gen) * 4
    flat = x.view(-1)
    n = flat.numel()
    flat[: n // 4] *= 1e-3  # around and below the smallest FP8 normal once scaled
    flat[n // 4 : n // 3] *= 1e3  # far past 448
    flat[-4:] = torch.tensor([0.0, -0.0, 448.0, -1e30])
    return x


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "bf16", "float32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_head", [False, True])
def test_kv_write_stores_the_same_bytes_as_the_pool(kv_dtype, dtype, per_head):
    from engine.cpu_kernels.paged_decode import kv_write

    gen = torch.Generator().manual_seed(11)
    heads, dim, tokens = 3, 64, 40
    layout = KVLayout(num_layers=1, kind="gqa", num_kv_heads=heads, head_dim=dim)
    pools = [PagedKVPool(layout, 8, 16, kv_dtype, per_head_scales=per_head) for _ in range(2)]
    scales = (
        torch.rand(1, heads, generator=gen) * 0.05 + 0.01 if per_head else torch.tensor([0.037])
    )
    for pool in pools:
        pool.set_scales(scales, scales * 0.5, "test")
    # k and v as views into one fused tensor, the way attention hands them over
    qkv = _awkward_values((tokens, 2 * heads + 4, dim), gen).to(dtype)
    k, v = qkv[:, 4 : 4 + heads], qkv[:, 4 + heads :]
    slots = torch.randperm(8 * 16, generator=gen)[:tokens]
    pools[0].write(0, k, v, slots)
    assert kv_write(k, v, slots, pools[1].storage[0], *pools[1].write_scales(0))
    assert torch.equal(pools[0].storage.view(torch.uint8), pools[1].storage.view(torch.uint8))


def test_every_float_rounds_to_the_fp8_byte_torch_gives():
    """All float32 values with 16 significant bits (every bfloat16 and the midpoints and
    near-midpoints between FP8 codes) through the kernel's conversion, against torch."""
    from engine.cpu_kernels.paged_decode import kv_write

    bits = torch.arange(0, 2**16, dtype=torch.int64)
    values = torch.cat([(bits << 16) + offset for offset in (0, 0x7FFF, 0x8000, 0x8001, 0xFFFF)])
    x = values.to(torch.int32).view(torch.float32)
    x = x[~x.isnan()]
    x = x[: x.numel() // 64 * 64].view(-1, 1, 64)
    layout = KVLayout(num_layers=1, kind="gqa", num_kv_heads=1, head_dim=64)
    pools = [PagedKVPool(layout, x.shape[0] // 16 + 1, 16, "fp8_e4m3") for _ in range(2)]
    for pool in pools:
        pool.set_scales(torch.tensor([1.0]), torch.tensor([1.0]), "test")
    slots = torch.arange(x.shape[0])
    pools[0].write(0, x, x, slots)
    assert kv_write(x, x, slots, pools[1].storage[0], *pools[1].write_scales(0))
    assert torch.equal(pools[0].storage, pools[1].storage)


def test_row_argmax_answers_as_torch_does_ties_nan_and_infinities():
    from engine.cpu_kernels.argmax import row_argmax

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 1000 + 7, generator=gen)  # a ragged last block
    logits[1, [5, 600, 900]] = 50.0  # ties: the first wins
    logits[2, 1006] = 60.0  # in the ragged tail
    logits[3] = float("-inf")  # all -inf: index 0
    logits[4, 17] = float("nan")  # a NaN wins
    logits[4, 30] = float("inf")
    logits[5, 100] = float("inf")
    logits[6] = 0.0  # all equal
    logits[7, 300:] = 3.0  # equal maxima spread over lanes
    got = row_argmax(logits)
    assert torch.equal(got, logits.argmax(-1))
    assert torch.equal(row_argmax(logits[:, :5].contiguous()), logits[:, :5].argmax(-1))


@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_fused_decode_steps_equal_the_per_module_path(kv):
    """decode_layers runs the same kernels in the same order: identical tokens and logprobs."""
    from engine import LLM, SamplingParams
    from engine.model_files.store import default_model_dir, is_complete

    if not is_complete(default_model_dir()):
        pytest.skip("default model not pulled: resident models pull")
    llm = LLM(str(default_model_dir()), kv_cache_dtype=kv, attention_backend="auto")
    trunk = llm.engine.model.model
    fused_step = trunk.decode_step
    assert fused_step is not None
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
    prompts = ["The capital of France is", "def add(a, b):", "Once upon a time"]
    calls = []
    run = fused_step.run
    fused_step.run = lambda *a: calls.append(1) or run(*a)
    fused = llm.generate(prompts, params)
    assert sum(calls) and len(calls) >= 11
    trunk.decode_step = None  # the layer loop, each module through the C layer ops
    llm.engine.prefix_cache.clear()  # recompute the prompts too
    plain = llm.generate(prompts, params)
    _assert_same_outputs(fused, plain)
    if kv == "fp8_e4m3":
        # New scales after fused steps ran: the fused step must take them up too.
        pool = llm.engine.pool
        pool.set_scales(pool.k_scale * 1.5, pool.v_scale * 0.75, "test")
        llm.engine.prefix_cache.clear()
        trunk.decode_step = fused_step
        fused = llm.generate(prompts, params)
        trunk.decode_step = None
        llm.engine.prefix_cache.clear()
        _assert_same_outputs(fused, llm.generate(prompts, params))


def _assert_same_outputs(got, want):
    for a, b in zip(got, want, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        logprobs = [t.logprob for t in a.outputs[0].logprobs]
        assert logprobs == [t.logprob for t in b.outputs[0].logprobs]


def test_the_kernel_benchmark_runs_and_prints_json():
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[2] / "bench" / "cpu_kernels.py"
    done = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["benchmark"] == "cpu_kernels"
    assert {r["rows"] for r in result["grid_products"]} == {1, 3}
    assert all(r["c_us"] > 0 and r["torch_us"] > 0 for r in result["decode_attention"])
    assert all(r["c_us"] > 0 and r["torch_us"] > 0 for r in result["mla_decode"])
    assert {(r["prefix"], r["new_tokens"]) for r in result["prefill_attention"]} == {
        (0, 40),
        (30, 17),
    }


def test_the_two_library_benchmark_alternates_and_prints_json(tiny_llama_dir):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from engine.cpu_kernels.library import library_path

    built = library_path()  # A and B the same build: a smoke test
    script = Path(__file__).parents[2] / "bench" / "cpu_kernels_ab.py"
    command = [sys.executable, str(script), str(tiny_llama_dir), built, built]
    command += ["--prompt", "24", "--new", "3", "--rounds", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["benchmark"] == "cpu_kernels_ab"
    assert [len(result["step_ms"][name]) for name in "AB"] == [2, 2]
    assert all(ms > 0 for name in "AB" for ms in result["step_ms"][name])
    assert result["b_speed_over_a"] > 0
