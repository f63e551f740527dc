"""A subagent's first request on the local engine: served from its parent's resident prefix.

Builds a repository whose snapshot is about 4k tokens, opens the agent on it
with the local engine, and runs the parent's first request (which prefills
and pins the resident prefix: system prompt, tools, snapshot). Then, in
interleaved rounds, a child is started through the `task` tool's own code
(agent/core/subagents) twice with the same task: once as the product runs it
(sharing the engine and its prefix cache), once cold (the same engine under
another cache salt, so no cached page can match: what a child costs an agent
that resends the repository for every child). Each child is held to one
request of one token, so its wall time is its time to first token.

Then four children at once (`--batch`), as one answer's task calls run, against
the same four one after the other, each decoding `--batch-tokens` tokens.

    OMP_NUM_THREADS=2 python bench/subagent_prefix.py [--rounds 3] [--files 18]

Prints one JSON object; exit 1 when a target is missed (share >= 0.95 and
warm TTFT <= 1/5 of cold).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.core.clients import start_local_client  # noqa: E402
from agent.core.clients.local import LocalClient  # noqa: E402
from agent.core.context import ContextSettings  # noqa: E402
from agent.core.events import Event  # noqa: E402
from agent.core.loop import AgentSettings  # noqa: E402
from agent.core.runtime import DEFAULT_MODEL, RuntimeOptions, open_runtime  # noqa: E402
from agent.core.subagents import TaskArgs  # noqa: E402
from agent.core.subagents.child import run_child  # noqa: E402
from tools import ApprovalMode  # noqa: E402

TARGET_SHARE = 0.95
TARGET_TTFT_RATIO = 0.2


def build_repository(root: Path, files: int) -> None:
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    for index in range(files):
        body = "\n".join(
            f"def measure_{index}_{n}(values):\n"
            f'    """Sum of the values times {n}, offset by {index}."""\n'
            f"    return sum(v * {n} for v in values) + {index}\n"
            for n in range(4)
        )
        path = root / "metrics" / f"module_{index:02d}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f'"""Metrics, part {index}."""\n\n{body}')
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@example.com",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@example.com",
    }
    subprocess.run(["git", "add", "-A"], cwd=root, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", "metrics"], cwd=root, check=True, env=env)


class Recorder:
    def __init__(self) -> None:
        self.completed: dict[str, Any] = {}
        self.snapshot: dict[str, Any] = {}

    def __call__(self, event: Event) -> None:
        if event.type == "subagent_completed":
            self.completed[event.id] = event
        elif event.type == "context_snapshot":
            self.snapshot = {"files": event.files, "tokens": event.tokens, "mode": event.mode}


async def timed_child(agent, call_id: str, prompt: str, recorder: Recorder) -> dict[str, Any]:
    args = TaskArgs(description="measure", prompt=prompt)
    started = time.perf_counter()
    await run_child(agent, call_id, args, agent.tools.ctx)
    seconds = time.perf_counter() - started
    done = recorder.completed[call_id]
    prompt_tokens, cached = done.first_prompt_tokens, done.first_cached_tokens
    return {
        "seconds": round(seconds, 4),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "cached_share": round(cached / prompt_tokens, 4) if prompt_tokens and cached else 0.0,
    }


async def measure(args: argparse.Namespace, workspace: Path) -> dict[str, Any]:
    client = start_local_client(args.model)
    recorder = Recorder()
    options = RuntimeOptions(
        workspace=workspace,
        model=args.model,
        approval=ApprovalMode.READ_ONLY,
        settings=AgentSettings(max_turns=1, max_tokens=1),
        context=ContextSettings(snapshot_fraction=args.snapshot_fraction),
        checkpoints=False,
        tools=None,
    )
    runtime = await open_runtime(options, [recorder], client=client)
    agent = runtime.agent
    rounds = []
    try:
        started = time.perf_counter()
        await agent.run_task("Reply with OK.")  # prefills and pins the resident prefix
        parent_first_s = time.perf_counter() - started
        for index in range(args.rounds):
            prompt = f"Round {index}: which module defines measure_{index}_2? Name the file."
            order = ["warm", "cold"] if index % 2 == 0 else ["cold", "warm"]
            row: dict[str, Any] = {}
            for kind in order:
                if kind == "cold":
                    agent.client = LocalClient(client.engine, args.model, cache_salt=f"cold{index}")
                try:
                    row[kind] = await timed_child(agent, f"{kind}-{index}", prompt, recorder)
                finally:
                    agent.client = client
            rounds.append(row)
        agent.settings = AgentSettings(max_turns=1, max_tokens=args.batch_tokens)
        prompts = [f"Batch task {n}: what does measure_{n}_1 return?" for n in range(args.batch)]
        started = time.perf_counter()
        for n, prompt in enumerate(prompts):
            await run_child(
                agent, f"seq-{n}", TaskArgs(description="seq", prompt=prompt), agent.tools.ctx
            )
        sequential_s = time.perf_counter() - started
        prompts = [p.replace("Batch task", "Batch job") for p in prompts]  # not cached yet
        started = time.perf_counter()
        await asyncio.gather(
            *(
                run_child(agent, f"par-{n}", TaskArgs(description="par", prompt=p), agent.tools.ctx)
                for n, p in enumerate(prompts)
            )
        )
        concurrent_s = time.perf_counter() - started
    finally:
        await runtime.close()
    warm_share = statistics.median(r["warm"]["cached_share"] for r in rounds)
    warm_s = statistics.median(r["warm"]["seconds"] for r in rounds)
    cold_s = statistics.median(r["cold"]["seconds"] for r in rounds)
    return {
        "snapshot": recorder.snapshot,
        "parent_first_request_s": round(parent_first_s, 4),
        "rounds": rounds,
        "median_warm_cached_share": warm_share,
        "median_warm_ttft_s": warm_s,
        "median_cold_ttft_s": cold_s,
        "warm_over_cold_ttft": round(warm_s / cold_s, 4),
        "batch": {
            "children": args.batch,
            "tokens_each": args.batch_tokens,
            "sequential_s": round(sequential_s, 3),
            "concurrent_s": round(concurrent_s, 3),
            "speedup": round(sequential_s / concurrent_s, 3),
            "cached_share": {
                kind: [
                    round(c.first_cached_tokens / c.first_prompt_tokens, 4)
                    for key, c in recorder.completed.items()
                    if key.startswith(kind) and c.first_prompt_tokens and c.first_cached_tokens
                ]
                for kind in ("seq", "par")
            },
        },
        "meets_targets": warm_share >= TARGET_SHARE and warm_s / cold_s <= TARGET_TTFT_RATIO,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=18, help="modules in the repository")
    parser.add_argument("--snapshot-fraction", type=float, default=0.92, help="of the window")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--batch-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="resident-bench-") as tmp:
        root = Path(tmp)
        os.environ["RESIDENT_DATA_DIR"] = str(root / "data")
        os.environ["RESIDENT_CACHE_DIR"] = str(root / "cache")  # no KV restored from disk
        workspace = root / "repo"
        workspace.mkdir()
        build_repository(workspace, args.files)
        result = asyncio.run(measure(args, workspace))
    report = {
        "benchmark": "subagent_prefix",
        "model": args.model,
        "targets": {"cached_share": TARGET_SHARE, "warm_over_cold_ttft": TARGET_TTFT_RATIO},
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        **result,
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0 if result["meets_targets"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
