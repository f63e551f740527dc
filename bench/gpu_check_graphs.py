"""CUDA-graph decode against eager decode on a GPU, for bench/gpu_check.py --quick.

On a tiny random Llama (built here, FP8 and BF16 KV, Triton attention):

1. one decode step of three sequences (a bucket of 4 with a pad row), eager
   and then replayed from a captured graph over the same cache: the logits
   must be equal (the same kernels and split grids; a tolerance of 1e-5
   allows float32 rounding), and a second replay after the inputs change
   must again equal eager;
2. engine.devtools.testing.decode_traffic's traffic (mixed steps, a prefix hit,
   preemption, speculative drafts) with graphs on and off: every request's
   tokens equal, and graphs actually replayed.

On CPU there is nothing to capture. `run_graph_checks(cpu, rehearse=True)`
(TRITON_INTERPRET=1) runs part 1 on the graphs' fixed buffers without a
capture, so the script itself is tested in `make test`; part 2 runs there
as tests/engine/triton/test_decode_graphs.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

LOGITS_ATOL = 1e-5


def _decode_batch(llm, prompts):
    from engine import SamplingParams

    engine = llm.engine
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    engine.step()  # prefill; each samples its first token
    return engine.scheduler.schedule()


def _graphs_of(llm):
    """The engine's graphs; on CPU (a rehearsal) the same fixed buffers without capture."""
    runner = llm.engine.runner
    if runner.graphs is None and runner.device.type == "cpu":
        from engine.devtools.testing.decode_traffic import on_fixed_buffers

        return on_fixed_buffers(llm)
    return runner.graphs


def _step_check(path: Path, kv: str) -> dict:
    from engine import LLM
    from engine.devtools.testing.decode_traffic import PROMPTS

    llm = LLM(
        str(path), dtype="float32", kv_cache_dtype=kv, attention_backend="triton", max_num_seqs=4
    )
    runner, graphs = llm.engine.runner, _graphs_of(llm)
    if graphs is None:
        return {"check": f"graph step {kv}", "ok": False, "error": "graphs not set up"}
    worst = 0.0
    batch = _decode_batch(llm, PROMPTS)
    for _ in range(2):  # the capture, then a replay with the next step's inputs
        runner.graphs = None
        eager = runner.run(batch, set()).sample_logits.clone()
        runner.graphs = graphs
        replayed = runner.run(batch, set()).sample_logits
        worst = max(worst, (replayed - eager).abs().max().item())
        # Advance as the engine would, with the greedy tokens, and schedule the next step.
        for item, token in zip(batch, eager.argmax(-1).tolist(), strict=True):
            item.seq.num_computed_tokens += 1
            item.seq.output_token_ids.append(token)
        batch = llm.engine.scheduler.schedule()
    return {
        "check": f"graph step vs eager, {kv} KV",
        "ok": worst <= LOGITS_ATOL and graphs.replays == 2 and not graphs.disabled,
        "max_abs_diff": worst,
        "captures": graphs.captures,
        "graphs": graphs.describe()["cuda_graphs"],
    }


def _traffic_check(path: Path) -> dict:
    from engine.devtools.testing.decode_traffic import run_traffic, traffic_llm

    eager = run_traffic(traffic_llm(path, attention_backend="triton", cuda_graphs=False))
    llm = traffic_llm(path, attention_backend="triton")
    got = run_traffic(llm)
    graphs = llm.engine.runner.graphs
    replays = graphs.replays if graphs is not None else 0
    return {
        "check": "traffic: graphs vs eager tokens",
        "ok": got.tokens == eager.tokens and replays > 0,
        "equal_requests": sum(a == b for a, b in zip(got.tokens, eager.tokens, strict=True)),
        "requests": len(eager.tokens),
        "preemptions": eager.preemptions,
        "speculative_steps": eager.speculative_steps,
        "graph_steps": replays,
    }


def run_graph_checks(device: torch.device, rehearse: bool = False) -> dict:
    if device.type != "cuda" and not rehearse:
        return {"ok": True, "checks": [], "note": "no GPU: nothing to capture"}
    from engine.devtools.testing.checkpoints import tiny_llama

    checks = []
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_llama(Path(tmp) / "llama")
        runs = [lambda: _step_check(path, "fp8_e4m3"), lambda: _step_check(path, "bf16")]
        if device.type == "cuda":
            runs.append(lambda: _traffic_check(path))
        for run in runs:
            try:
                checks.append(run())
            except Exception as err:  # one check's failure is reported, the rest still run
                checks.append({"check": "graphs", "ok": False, "error": repr(err)[:300]})
    return {"ok": all(c["ok"] for c in checks), "checks": checks}
