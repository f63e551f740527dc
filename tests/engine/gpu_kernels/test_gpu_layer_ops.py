"""GpuLayerOps (engine/layers/gpu_layer_ops.py): which calls the Triton kernels take, the torch
reference for the rest, and the kernels inside real models' forward passes.

Without a GPU the ops send everything to torch (CPU tensors); to run the
kernels there, the tests make GpuLayerOps count CPU tensors as its device,
and the kernels run under Triton's interpreter (this folder's conftest). On
a GPU the same tests run on CUDA tensors, compiled.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.gpu_kernels import layer_ops as kernels  # noqa: E402
from engine.layers import gpu_layer_ops  # noqa: E402
from engine.layers.gpu_layer_ops import GPU_LAYER_OPS  # noqa: E402
from engine.layers.layer_ops import TORCH_LAYER_OPS  # noqa: E402
from engine.layers.rotary import RotaryEmbedding, rope_inv_freq  # noqa: E402

OP_KERNELS = ("rms_norm", "silu_mul", "rope_")


@pytest.fixture
def kernel_calls(monkeypatch) -> dict[str, int]:
    """Count the kernel launchers' calls (they still run)."""
    calls = dict.fromkeys(OP_KERNELS, 0)
    for name in OP_KERNELS:
        original = getattr(kernels, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(kernels, name, counted)
    return calls


@pytest.fixture
def kernel_device(monkeypatch, device) -> torch.device:
    """Where the kernels run in this session: CUDA, or the CPU under the interpreter."""
    if device.type == "cpu":
        monkeypatch.setattr(gpu_layer_ops, "_kernel_device", lambda t: True)
    return device


def _rotary(rotary_dim: int = 16, interleaved: bool = False) -> RotaryEmbedding:
    inv_freq, _ = rope_inv_freq(rotary_dim, {"rope_theta": 10000.0})
    return RotaryEmbedding(rotary_dim, 64, inv_freq, interleaved)


def _every_op(ops, x, residual, weight, gate_up, q, positions, rotary):
    """Each op once; the results (q rotated in a copy)."""
    rotated = q.clone()
    ops.rope_(rotated, positions, rotary, None)
    return [ops.rms_norm(x, weight, 1e-6), *ops.add_rms_norm(x, residual, weight, 1e-6),
            ops.silu_mul(gate_up), rotated]  # fmt: skip


def _inputs(dtype=torch.float32, device=torch.device("cpu")):
    gen = torch.Generator().manual_seed(3)
    x, residual = (torch.randn(3, 40, generator=gen).to(device, dtype) for _ in range(2))
    weight = (torch.rand(40, generator=gen) + 0.5).to(device, dtype)
    gate_up = torch.randn(3, 2 * 24, generator=gen).to(device, dtype)
    q = torch.randn(3, 2, 16, generator=gen).to(device, dtype)
    positions = torch.tensor([0, 5, 9], device=device)
    return x, residual, weight, gate_up, q, positions, _rotary().to(device)


def test_cpu_tensors_run_the_torch_reference(kernel_calls):
    for dtype in (torch.float32, torch.bfloat16):
        inputs = _inputs(dtype)
        got = _every_op(GPU_LAYER_OPS, *inputs)
        want = _every_op(TORCH_LAYER_OPS, *inputs)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert kernel_calls == dict.fromkeys(OP_KERNELS, 0)


def test_device_tensors_go_to_the_kernels(kernel_device, kernel_calls):
    x, residual, weight, gate_up, q, positions, rotary = _inputs(device=kernel_device)
    got = _every_op(GPU_LAYER_OPS, x, residual, weight, gate_up, q, positions, rotary)
    assert kernel_calls == {"rms_norm": 2, "silu_mul": 1, "rope_": 1}
    rotated = q.clone()
    kernels.rope_(rotated, positions, rotary.cos, rotary.sin, 16, False)
    want = [kernels.rms_norm(x, weight, 1e-6), *kernels.rms_norm(x, weight, 1e-6, residual),
            kernels.silu_mul(gate_up), rotated]  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    rotary.ops = GPU_LAYER_OPS  # the module's own call reaches them too
    rotary(positions, q.clone())
    assert kernel_calls["rope_"] == 3


def test_what_the_kernels_do_not_take_runs_the_reference(kernel_device, kernel_calls):
    """Another dtype, a weight in another dtype, a strided last dimension, rows wider than the
    kernel's registers: the torch reference, bit for bit, and no kernel."""
    x, residual, weight, gate_up, q, positions, rotary = _inputs(device=kernel_device)
    wide = torch.randn(2, gpu_layer_ops.MAX_NORM_WIDTH + 2, device=kernel_device)
    cases = [
        lambda ops: ops.rms_norm(x.double(), weight.double(), 1e-6),
        lambda ops: ops.rms_norm(x.bfloat16(), weight, 1e-6),
        lambda ops: ops.rms_norm(x.t().contiguous().t(), weight, 1e-6),
        lambda ops: ops.rms_norm(wide, torch.ones(wide.shape[1], device=kernel_device), 1e-6),
        lambda ops: ops.add_rms_norm(x, residual.double(), weight, 1e-6),
        lambda ops: ops.silu_mul(gate_up.t().contiguous().t()),
        lambda ops: ops.silu_mul(gate_up.double()),
    ]
    for case in cases:
        got, want = case(GPU_LAYER_OPS), case(TORCH_LAYER_OPS)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # [3, 2, 16], dims strided
    for tensor in (q.double(), strided):
        got, want = tensor.clone(), tensor.clone()
        GPU_LAYER_OPS.rope_(got, positions, rotary, None)
        TORCH_LAYER_OPS.rope_(want, positions, rotary, None)
        assert torch.equal(got, want) and not torch.equal(got, tensor)
    assert kernel_calls == dict.fromkeys(OP_KERNELS, 0)


def test_the_ops_and_the_kernels_agree_on_what_they_take():
    assert gpu_layer_ops.MAX_NORM_WIDTH == kernels.MAX_NORM_WIDTH
    assert gpu_layer_ops.KERNEL_DTYPES == kernels.KERNEL_DTYPES


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict:
    from engine.devtools.testing.checkpoints import build_deepseek_v3, build_glm4_moe, tiny_glm4

    root = tmp_path_factory.mktemp("layer_ops_models")
    return {
        # q/k norms on views of the fused qkv, NeoX rotary on half the head, MoE + shared expert
        "glm4_moe": build_glm4_moe(root / "glm4_moe"),
        # MLA: q and latent norms on column slices, interleaved rotary on each head's last dims
        "deepseek_v3": build_deepseek_v3(root / "deepseek_v3"),
        # four norms a layer, interleaved rotary on half of each q and k head
        "glm4": tiny_glm4(root / "glm4"),
    }


@pytest.mark.parametrize("family", ["glm4_moe", "deepseek_v3", "glm4"])
def test_models_compute_the_same_logits_through_the_kernels(
    tiny_models, family, kernel_device, kernel_calls
):
    """float32 models: prefill and decode steps with the kernels against the torch ops. The
    only differences are the norms' sums of squares (a few float32 units each) and numpy's
    exp against torch's, carried through two layers: 1e-5 of the logits' range covers them;
    a wrong layout, stride or rounding moves logits by a good part of it."""
    from engine import LLM
    from tests.engine.agreement import teacher_forced

    llm = LLM(str(tiny_models[family]), dtype="float32", kv_cache_dtype="auto")
    sequences = [[3, 17, 101, 5, 66, 9, 12, 200, 41, 7], [8, 8, 150, 2]]
    llm.engine.model.use_layer_ops(TORCH_LAYER_OPS)  # on a GPU the engine chose the kernels
    want = teacher_forced(llm, sequences, decoded=3)
    assert kernel_calls == dict.fromkeys(OP_KERNELS, 0)
    routed = llm.engine.model.use_layer_ops(GPU_LAYER_OPS)
    assert routed["norm"] > 0 and routed["rotary"] == 1
    got = teacher_forced(llm, sequences, decoded=3)
    assert all(count > 0 for count in kernel_calls.values()), kernel_calls
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_the_gpu_check_section_runs_its_checks_and_timings(device):
    """bench/gpu_check_layer_ops.py on its smoke sizes (float32, interpreter): every op of both
    models checked against TorchLayerOps and timed; gpu_check.py runs it only on a GPU."""
    import sys
    import time
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from bench.gpu_check_layer_ops import run_layer_ops, table_lines

    def timer(fn, iters, warmup):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    result = run_layer_ops("smoke", device, timer)
    checks = {c["check"]: c for c in result["checks"]}
    assert all(c["ok"] and "error" not in c for c in checks.values()), checks
    ops = {r["op"] for r in result["timings"]}
    assert ops == {"rms_norm", "add_rms_norm", "rms_norm_heads", "rms_norm_24", "rms_norm_16",
                   "silu_mul_24", "silu_mul_20", "rope", "rope_write"}  # fmt: skip
    # Two row counts; GLM 5 ops and the fused rotary + rotation + KV write, Kimi 6.
    assert len(result["timings"]) == len(checks) == 2 * (6 + 6)
    assert checks["rope kimi-k2 3 rows"]["exact"] and checks["rope glm-4.5 1 rows"]["exact"]
    fused = checks["rope_write glm-4.5 3 rows"]
    assert fused["max_code_steps"] <= 1 and fused["q_max_steps"] <= 1
    assert all(r["kernel_ms"] > 0 and r["torch_ms"] > 0 for r in result["timings"])
    assert table_lines(result)[-1].startswith(f"layer ops: {len(checks)}/{len(checks)} ok")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the engine chooses them on a GPU")
def test_the_engine_chooses_them_on_a_gpu_unless_deterministic(tiny_models):
    from engine import LLM

    path = str(tiny_models["glm4"])
    model = LLM(path, dtype="bfloat16", kv_cache_dtype="bf16").engine.model
    assert all(getattr(m, "ops", GPU_LAYER_OPS) is GPU_LAYER_OPS for m in model.modules())
    layer = model.model.layers[0]
    assert layer.ops is GPU_LAYER_OPS and layer.self_attn.rotary.ops is GPU_LAYER_OPS
    model = LLM(path, dtype="bfloat16", kv_cache_dtype="bf16", deterministic=True).engine.model
    assert all(getattr(m, "ops", TORCH_LAYER_OPS) is TORCH_LAYER_OPS for m in model.modules())
