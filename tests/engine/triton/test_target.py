"""The GPU a launch is sized for, and the Triton versions the engine accepts at start."""

from __future__ import annotations

import pytest
import torch

import engine.attention.triton as triton_pkg
from engine.attention.triton.target import (
    INTERPRETER_SMS,
    PlannedGPU,
    capability,
    on_gpu,
    planning_for,
    sm_count,
)
from engine.errors import EngineError

H200 = PlannedGPU("H200", (9, 0), 132)


def test_meta_tensors_stand_for_the_planned_gpu_only_while_planning():
    meta, cpu = torch.empty(2, device="meta"), torch.empty(2)
    assert (capability(meta.device), sm_count(meta.device), on_gpu(meta)) == (
        None,
        INTERPRETER_SMS,
        False,
    )
    with planning_for(H200):
        assert capability(meta.device) == (9, 0) and sm_count(meta.device) == 132
        assert on_gpu(meta) and not on_gpu(cpu)
        assert capability(cpu.device) is None and sm_count(cpu.device) == INTERPRETER_SMS
    assert capability(meta.device) is None


def test_fp8_activations_go_to_the_kernel_on_the_planned_gpu():
    """quantize_activations takes the Triton path for a GPU tensor (the check records it)."""
    pytest.importorskip("triton")
    from engine.gpu_kernels import fp8_act_quant

    x = torch.empty(3, 256, dtype=torch.bfloat16, device="meta")
    seen = []
    real = fp8_act_quant.quantize_activations_triton
    try:
        fp8_act_quant.quantize_activations_triton = lambda x, group: seen.append(x) or (x, x)
        fp8_act_quant.quantize_activations(x)
        assert seen == []  # no GPU: the torch reference
        with planning_for(H200):
            fp8_act_quant.quantize_activations(x)
        assert seen == [x]
    finally:
        fp8_act_quant.quantize_activations_triton = real


@pytest.mark.parametrize(
    "found, refused", [((3, 4), True), ((2, 3), True), ((3, 5), False), ((3, 9), False)]
)
def test_a_triton_older_than_the_checked_ones_is_refused_at_start(monkeypatch, found, refused):
    pytest.importorskip("triton")
    from engine.attention.triton.backend import TritonAttentionBackend

    monkeypatch.setattr(triton_pkg, "triton_version", lambda: found)
    problem = triton_pkg.triton_version_problem()
    if not refused:
        assert problem is None
        TritonAttentionBackend()
        return
    assert f"Triton {found[0]}.{found[1]} is installed" in problem and "3.5 or newer" in problem
    with pytest.raises(EngineError, match="GPU kernels need Triton 3.5"):
        TritonAttentionBackend()


def test_newer_tritons_than_the_checked_ones_are_flagged():
    assert triton_pkg.triton_untested((3, 10)) and not triton_pkg.triton_untested((3, 9))
