"""A server's traffic in a few engine steps, for comparing decode paths (CUDA graphs or not),
and the graphs' fixed buffers without a capture, for checking them on CPU.

Steps of every kind around plain decode steps: arrivals while others decode
(mixed steps), a prompt that shares a cached prefix, more sequences than a
small pool holds (preemption and recompute), and a request with speculative
drafts (verification steps). Two engines that decode differently must give
every request the same tokens. tests/engine/triton/test_decode_graphs.py
runs it on CPU on the graphs' fixed buffers; bench/gpu_check_graphs.py on a
GPU with real captures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine import LLM, SamplingParams
from engine.execution.decode_graphs import DecodeGraphs
from engine.execution.decode_inputs import DecodeInputs
from engine.kv.sizing import kv_bytes_per_token

PROMPTS = [
    [5, 17, 42, 99, 3, 250, 7, 61, 88],
    [130, 12, 33, 201, 4, 76, 200, 9, 14, 15, 92, 6, 18, 27, 44, 51, 63, 70, 81],
    [11, 22],
]
REPEATING = [7, 8, 9, 10, 11, 7, 8, 9, 10, 11, 7, 8]  # prompt lookup finds drafts here
PAGES = 5  # of 16 tokens: five sequences of 14-24 tokens cannot all stay resident


@dataclass
class TrafficResult:
    tokens: list[list[int]]  # each request's output tokens, in arrival order
    preemptions: int
    speculative_steps: int


def traffic_llm(path: Path, **overrides) -> LLM:
    """An engine on `path` with a pool of PAGES pages (FP8 unless overridden)."""
    settings = dict(dtype="float32", kv_cache_dtype="fp8_e4m3", max_model_len=64)
    settings.update(overrides)
    probe = LLM(str(path), **{**settings, "kv_memory": 0.01}).engine
    per_token = kv_bytes_per_token(probe.layout, probe.kv_dtype)
    del probe
    return LLM(str(path), kv_memory=PAGES * 16 * per_token / 1024**3, **settings)


def on_fixed_buffers(llm: LLM, max_batch: int = 4) -> DecodeGraphs:
    """Give the engine's runner CUDA-graph decode without the capture: the graphs' fixed
    buffers, pad rows and capacity-planned grids, run eagerly (how a CPU checks them)."""
    runner, engine = llm.engine.runner, llm.engine
    inputs = DecodeInputs(max_batch, engine.max_model_len, engine.config.page_size, runner.device)
    runner.graphs = DecodeGraphs(runner.model, runner.pool, runner.backend, inputs, capture=False)
    return runner.graphs


def run_traffic(llm: LLM) -> TrafficResult:
    engine = llm.engine
    plain = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    drafted = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, speculative=True)
    seqs = [engine.add_request(PROMPTS[0], plain), engine.add_request(PROMPTS[2], plain)]
    for _ in range(3):
        engine.step()
    seqs.append(engine.add_request(PROMPTS[0] + [77, 78], plain))  # shares a cached prefix
    seqs.append(engine.add_request(REPEATING, drafted))
    seqs.append(engine.add_request(PROMPTS[1][:12], plain))
    while engine.has_unfinished():
        engine.step()
    return TrafficResult(
        tokens=[seq.output_token_ids for seq in seqs],
        preemptions=sum(seq.num_preemptions for seq in seqs),
        speculative_steps=engine.speculator.steps,
    )
