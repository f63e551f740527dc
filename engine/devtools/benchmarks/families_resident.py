"""Resident's side of `resident bench families`, each figure in a process of its own.

A worker process (`python -m engine.devtools.benchmarks.families_resident MODEL`) loads
the model once, as `resident serve` does (its defaults: FP8 KV, the fastest CPU
kernels; KV scales calibrated at start), with the prefix cache off so no round
reuses another's prompt, then answers one figure per line on stdin with one
line on stdout. It stays up between rounds, idle while llama.cpp runs.

- one_stream and long_context: the request is added to the engine and stepped;
  the clock starts once the prefill has given the first token and stops at the
  last, so it times exactly the `new` single-token decode steps after a
  `prompt`-token context, as llama-bench's `-d prompt -n new` does.
- batch16: `sequences` requests added at once and stepped; the clock starts
  once every one has its first token (all prefills done) and stops when the
  last finishes: `sequences x new` tokens of decode steps, timed directly as
  llama-batched-bench times llama.cpp's. (It was the difference of two whole
  `LLM.generate` runs with and without the decode, where the 8,192 prompt
  tokens' half a minute of prefill on each side swung the figure by up to 30%
  between runs of the same code.)
- prefill: `LLM.generate` of one token after `prompt` tokens, timed whole.
- long_decode: one_stream's timing after a prompt of each of the asked
  contexts in turn (long_decode.py), one prefill per context.

The worker's first line gives facts about its engine, among them what one
sequence holds: KV bytes per token and, for a hybrid model, its recurrent
state's bytes.

The load figure is not the worker's: `resident serve` is started afresh per
round and timed to its first token (family_runs.time_to_first_token), with a
cache folder of the run's own: the first round is a first start ever (it
calibrates the FP8 KV scales on the built-in sample and caches them), later
rounds are the starts a user makes afterwards (the scales read back). Both are
reported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine.devtools.benchmarks.family_runs import SIZES, prompt_ids, time_to_first_token
from engine.devtools.benchmarks.long_decode import DEFAULT_CONTEXTS, NEW_TOKENS
from engine.devtools.benchmarks.long_decode import FIGURE as LONG_DECODE
from engine.devtools.benchmarks.measured_process import Running

if TYPE_CHECKING:
    from engine.core.llm_engine import LLMEngine

_MARK = "@families "  # result lines; the engine's own log may share stdout


def _say(message: dict) -> None:
    print(_MARK + json.dumps(message), flush=True)


def _decode_rate(engine: LLMEngine, prompts: list[list[int]], new: int) -> float:
    """Decode tokens/s of these prompts at once, from the step after the last first
    token to the last token."""
    from engine import SamplingParams

    params = SamplingParams(max_tokens=new + 1, temperature=0, ignore_eos=True)
    seqs = [engine.add_request(prompt, params) for prompt in prompts]
    while not all(seq.output_token_ids for seq in seqs):
        engine.step()
    made = sum(len(seq.output_token_ids) for seq in seqs)
    start = time.perf_counter()
    while not all(seq.is_finished for seq in seqs):
        engine.step()
    made = sum(len(seq.output_token_ids) for seq in seqs) - made
    return made / (time.perf_counter() - start)


def _generate_s(llm, prompts: list[list[int]], tokens: int) -> float:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    made = [len(o.outputs[0].token_ids) for o in outputs]
    if any(count != tokens for count in made):
        raise RuntimeError(f"asked for {tokens} tokens per prompt, got {made}")
    return elapsed


def _sequence_bytes(engine: LLMEngine) -> dict:
    """What one sequence holds: KV per token, and a hybrid model's fixed state."""
    facts = {"kv_bytes_per_token": engine.stats()["kv_bytes_per_token"]}
    states = engine.parts.rank.state_pool
    if states is not None:
        per_sequence = states.layout.bytes_per_sequence(states.conv_dtype.itemsize)
        facts["recurrent_state_bytes_per_sequence"] = per_sequence
    return facts


def _figure(llm, ask: dict) -> dict:
    figure, seed = ask["figure"], ask["seed"]
    size = SIZES.get(figure, {})
    if figure in ("one_stream", "long_context"):
        prompt = prompt_ids(size["prompt"], seed)
        return {"tok_s": _decode_rate(llm.engine, [prompt], size["new"])}
    if figure == LONG_DECODE:
        rates = {
            str(context): _decode_rate(llm.engine, [prompt_ids(context, seed)], NEW_TOKENS)
            for context in ask["contexts"]
        }
        return {"tok_s": rates, "new": NEW_TOKENS}
    if figure == "prefill":
        return {"tok_s": size["prompt"] / _generate_s(llm, [prompt_ids(size["prompt"], seed)], 1)}
    if figure == "batch16":
        prompts = [prompt_ids(size["prompt"], seed * 1000 + i) for i in range(size["sequences"])]
        return {"tok_s": _decode_rate(llm.engine, prompts, size["new"])}
    raise ValueError(f"unknown figure {figure!r}")


def worker(model: str, threads: int, top_k: int, n_routed: int) -> None:
    import torch

    torch.set_num_threads(threads)
    from engine import LLM
    from engine.devtools.benchmarks.decode_bytes import decode_bytes, engine_held
    from engine.host.memory_advice import pages_settled
    from engine.kv.calibration import calibrate_without_fixed_scales

    llm = LLM(model, enable_prefix_caching=False)
    calibrate_without_fixed_scales(llm)  # as `resident serve` does at start
    _generate_s(llm, [prompt_ids(64, -1)], 8)  # warm-up: first-call costs are not speed
    # Nor is start-up's collapse of the packed weights into huge pages (a few seconds of
    # a core, after the first requests): the figures are steady decoding's.
    pages_settled()
    engine = llm.engine
    _say(
        {
            "decode_bytes": decode_bytes(engine_held(engine.model), top_k, n_routed),
            "kv_cache_dtype": llm.config.kv_cache_dtype,
            "cpu_kernel": engine.cpu_kernel,
            "linear_methods": engine.linear_methods,
            **_sequence_bytes(engine),
        }
    )
    for line in sys.stdin:
        _say(_figure(llm, json.loads(line)))


class ResidentSide:
    """The parent's handle on Resident: the worker (started on first use) and fresh
    `resident serve` processes for the load figure."""

    name = "resident"

    def __init__(
        self,
        model: str,
        threads: int,
        top_k: int,
        n_routed: int,
        contexts: tuple[int, ...] = DEFAULT_CONTEXTS,
    ):
        self.model, self.threads, self.contexts = model, threads, list(contexts)
        self.top_k, self.n_routed = top_k, n_routed
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.worker: Running | None = None
        self.facts: dict = {}
        # The servers' cache (RESIDENT_CACHE_DIR): empty until the first start fills it.
        self.cache_dir = tempfile.mkdtemp(prefix="resident-bench-cache-")

    def _read(self) -> dict:
        assert self.worker is not None and self.worker.process.stdout is not None
        for line in self.worker.process.stdout:
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK) :])
        raise RuntimeError(f"Resident's worker exited: {self.worker.log_tail()}")

    def _ask(self, figure: str, seed: int) -> dict:
        if self.worker is None:
            command = [
                sys.executable,
                "-m",
                "engine.devtools.benchmarks.families_resident",
                self.model,
            ]
            command += ["--threads", str(self.threads), "--top-k", str(self.top_k)]
            command += ["--routed-experts", str(self.n_routed)]
            self.worker = Running(command, self.env, pipes=True)
            self.facts = self._read()
        assert self.worker.process.stdin is not None
        ask = {"figure": figure, "seed": seed, "contexts": self.contexts}
        self.worker.process.stdin.write(json.dumps(ask) + "\n")
        self.worker.process.stdin.flush()
        return self._read()

    def measure(self, figure: str, seed: int) -> dict:
        if figure != "load":
            return self._ask(figure, seed)
        from engine.distributed.launch import free_port

        port = free_port()
        command = [sys.executable, "-m", "engine", "serve", "--model", self.model]
        # Not the disk tier: a cold start must not restore KV a previous round saved.
        command += ["--port", str(port), "--no-kv-disk"]
        first_start = not any(Path(self.cache_dir).rglob("*.json"))
        env = {**self.env, "RESIDENT_CACHE_DIR": self.cache_dir}
        sample = time_to_first_token(command, f"http://127.0.0.1:{port}", env)
        return {**sample, "first_start": first_start}

    def close(self) -> dict:
        """Facts about the worker's engine, with its peak RSS over every figure."""
        if self.worker is not None:
            self.facts["worker_peak_rss_bytes"] = self.worker.stop()
        shutil.rmtree(self.cache_dir, ignore_errors=True)
        return self.facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--routed-experts", type=int, default=0)
    args = parser.parse_args()
    worker(args.model, args.threads, args.top_k, args.routed_experts)


if __name__ == "__main__":
    main()
