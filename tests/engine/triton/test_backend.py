"""Choosing the attention backend, and a whole model on the Triton backend against torch."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from agent.cli import app
from engine.attention.deterministic import DeterministicAttentionBackend
from engine.attention.registry import get_backend
from engine.attention.torch_backend import TorchAttentionBackend
from engine.errors import EngineError
from engine.server.launch import ServeOptions, ServeUsageError, check_options

PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 88, 130, 12, 33, 301, 4, 76, 200, 9, 14, 15, 92, 6]
# float32 model: both backends read the same cache; summation order differs.
LOGITS_TOL = 1e-4
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU defaults")


@cpu_only
def test_auto_on_cpu_is_the_cpu_kernels_where_they_run_else_torch(monkeypatch):
    from engine.attention.cpu_backend import CPUAttentionBackend
    from engine.cpu_kernels import library

    expected = TorchAttentionBackend if library.unavailable() else CPUAttentionBackend
    assert type(get_backend("auto")) is expected
    assert type(get_backend("auto", device="cpu")) is expected
    assert type(get_backend("auto", deterministic=True)) is DeterministicAttentionBackend
    assert type(get_backend("torch")) is TorchAttentionBackend
    monkeypatch.setattr(library, "unavailable", lambda: "no compiler (test)")
    assert type(get_backend("auto")) is TorchAttentionBackend
    with pytest.raises(EngineError, match="'cpu' cannot run here: no compiler"):
        get_backend("cpu")


def test_unknown_and_conflicting_choices_are_clear_errors():
    with pytest.raises(EngineError, match="use one of auto, torch, cpu, triton"):
        get_backend("magic")
    with pytest.raises(EngineError, match="--deterministic"):
        get_backend("triton", deterministic=True)


def test_triton_missing_is_a_clear_error(monkeypatch):
    import engine.attention.triton as triton_pkg

    monkeypatch.setattr(triton_pkg, "triton_available", lambda: False)
    with pytest.raises(EngineError, match="needs the triton package"):
        get_backend("triton")
    assert type(get_backend("auto", device="cuda")) is TorchAttentionBackend


@cpu_only
def test_triton_on_cpu_without_the_interpreter_is_a_clear_error(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(EngineError, match="runs on a CUDA GPU"):
        get_backend("triton")


def test_triton_backend_hands_cpu_tensors_to_its_fallback(monkeypatch):
    """`auto` on a CUDA machine whose model runs on CPU: the torch fallback answers."""
    pytest.importorskip("triton")
    from engine.attention.triton.backend import TritonAttentionBackend

    class Recorder:
        calls = 0

        def forward(self, *args):
            Recorder.calls += 1
            return "from fallback"

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.zeros(1, 2, 16)
    backend = TritonAttentionBackend(fallback=Recorder())
    assert backend.forward(0, q, q, q, None, None, 1.0) == "from fallback"
    assert Recorder.calls == 1
    with pytest.raises(EngineError, match="CUDA tensors"):
        TritonAttentionBackend().forward(0, q, q, q, None, None, 1.0)


def test_serve_takes_an_attention_backend():
    assert check_options(ServeOptions(model="m", attention_backend="triton"))
    with pytest.raises(ServeUsageError, match="--attention-backend must be one of"):
        check_options(ServeOptions(model="m", attention_backend="magic"))
    result = CliRunner().invoke(
        app, ["serve", "--model", "/nonexistent", "--attention-backend", "magic"]
    )
    assert result.exit_code == 2 and "--attention-backend must be one of" in result.output


@pytest.fixture(scope="module")
def llms(tiny_llama_dir):
    pytest.importorskip("triton")
    from engine import LLM

    def make(backend: str, kv: str):
        return LLM(
            str(tiny_llama_dir), dtype="float32", kv_cache_dtype=kv, attention_backend=backend
        )

    return make


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_model_on_triton_matches_torch(llms, kv):
    """Prompt logits through the paged cache: prefill kernels (and, for fp8, reads of FP8
    pages the pool calibrated and wrote on this first prefill) against the torch backend."""
    torch_llm, triton_llm = llms("torch", kv), llms("triton", kv)
    assert triton_llm.engine.runner.backend.name == "triton"
    expected = torch_llm.prompt_logits(PROMPT)
    got = triton_llm.prompt_logits(PROMPT)
    assert (got - expected).abs().max().item() < LOGITS_TOL
    # Calibrated from each layer's own K/V, which the layers below computed in a
    # different summation order: equal to float32 rounding.
    for name, values in torch_llm.engine.pool.scales().items():
        assert triton_llm.engine.pool.scales()[name] == pytest.approx(values, rel=1e-5)


def test_greedy_decode_on_triton_matches_torch(llms, monkeypatch):
    """Decode steps (write kernel, split decode kernel) give the same greedy tokens."""
    from engine import SamplingParams
    from engine.attention.triton import backend as triton_backend

    decode_calls = []
    kernel = triton_backend.gqa_decode
    monkeypatch.setattr(
        triton_backend, "gqa_decode", lambda *a, **k: decode_calls.append(1) or kernel(*a, **k)
    )

    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompts = [PROMPT[:9], PROMPT]  # two sequences of different lengths in one batch
    expected = [o.outputs[0].token_ids for o in llms("torch", "auto").generate(prompts, params)]
    got = [o.outputs[0].token_ids for o in llms("triton", "auto").generate(prompts, params)]
    assert len(got[0]) == 6 and len(decode_calls) >= 2 * 5  # 2 layers, 5 decode steps
    assert got == expected


def test_fp8_decode_dots_is_the_default_and_can_be_turned_off(tiny_llama_dir, monkeypatch):
    """FP8 pages decode on e4m3 dots by default (the interpreter counts as a GPU with FP8
    tensor cores); `fp8_decode_dots=False` (`--no-fp8-decode-dots`) widens them."""
    pytest.importorskip("triton")
    from engine import LLM, SamplingParams
    from engine.attention.triton import decode

    chosen = []
    choose = decode.choose_fp8_dot
    monkeypatch.setattr(
        decode, "choose_fp8_dot", lambda *a: chosen.append(choose(*a)) or chosen[-1]
    )
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    for setting, expected in ((True, True), (False, False)):
        chosen.clear()
        llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="fp8_e4m3",
                  attention_backend="triton", fp8_decode_dots=setting)  # fmt: skip
        assert llm.engine.runner.backend.fp8_dot is (None if setting else False)
        assert llm.engine.stats()["fp8_decode_dots"] == ("on" if setting else "off")
        out = llm.generate([PROMPT[:9]], params)[0].outputs[0].token_ids
        assert len(out) == 3 and chosen and set(chosen) == {expected}
