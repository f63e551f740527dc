"""Decode steps (or prefills) of one loaded model under two builds of the CPU kernels, alternated.

    python bench/cpu_kernels_ab.py MODEL A.so B.so [--sequences 1] [--new 64] [--rounds 6]
    python bench/cpu_kernels_ab.py MODEL A.so B.so --prefill [--prompt 2048]

On a shared machine whose speed drifts by 10-20% between runs, two processes cannot
tell a 5% kernel change from noise; one process can, stepping the same model in
turns under each library (round r runs A then B, the next B then A). A and B are the
kernel libraries two source trees build (`python -c "from engine.cpu_kernels.library
import library_path; print(library_path())"` in each tree); their exported functions
and the structs they read must be the same. Prints JSON: each round's mean step time
in ms per library, the medians, and B's speed over A's. With --prefill, a round is one
prompt of --prompt tokens taken to its first token, timed whole.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time


def _use(library: ctypes.CDLL) -> None:
    import engine.cpu_kernels.library as kernels

    kernels._load = lambda: (library, "")  # what library() hands every kernel call


def _step_ms(engine, prompts: list[list[int]], new: int) -> float:
    """Mean time of the decode steps once every prompt has its first token."""
    from engine import SamplingParams

    params = SamplingParams(max_tokens=new + 1, temperature=0, ignore_eos=True)
    seqs = [engine.add_request(prompt, params) for prompt in prompts]
    while not all(seq.output_token_ids for seq in seqs):
        engine.step()
    start, steps = time.perf_counter(), 0
    while not all(seq.is_finished for seq in seqs):
        engine.step()
        steps += 1
    return (time.perf_counter() - start) / steps * 1000


def _prefill_ms(llm, prompt: list[int]) -> float:
    """Time of one prompt to its first token (no prefix cache: every token computed)."""
    from engine import SamplingParams

    start = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0))
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("a", help="kernel library A (.so)")
    parser.add_argument("b", help="kernel library B (.so)")
    parser.add_argument("--sequences", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prefill", action="store_true", help="time prefills of --prompt tokens")
    args = parser.parse_args()
    from engine import LLM, SamplingParams
    from engine.cpu_kernels.library import open_library
    from engine.devtools.benchmarks.family_runs import prompt_ids
    from engine.host.memory_advice import pages_settled

    libraries = {"A": open_library(args.a), "B": open_library(args.b)}
    _use(libraries["A"])
    llm = LLM(args.model, enable_prefix_caching=False)
    warm = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    llm.generate([prompt_ids(64, -1)], warm)
    pages_settled()  # start-up's huge-page collapse is not decoding
    steps: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            _use(libraries[name])
            prompts = [prompt_ids(args.prompt, r * 1000 + i) for i in range(args.sequences)]
            took = (
                _prefill_ms(llm, prompts[0])
                if args.prefill
                else _step_ms(llm.engine, prompts, args.new)
            )
            steps[name].append(round(took, 3))
    medians = {name: statistics.median(times) for name, times in steps.items()}
    result = {
        "benchmark": "cpu_kernels_ab",
        "model": args.model,
        "sequences": args.sequences,
        "measured": f"prefill of {args.prompt} tokens" if args.prefill else "decode step",
        "step_ms": steps,
        "median_step_ms": medians,
        "b_speed_over_a": round(medians["A"] / medians["B"], 3),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
