"""How much of a new epoch's first prompt the prefix cache serves after one edited file.

A 30-file git repository (commits at distinct times) is rendered as the
agent's resident snapshot; the default model prefills that prompt, one file
is edited, a new epoch's snapshot is rendered and prefilled, and the engine
reports how many of its tokens came from the prefix cache. Three edited
files: the one git changed most recently (where work usually is), the
middle one, and the oldest (the worst case). Each is measured three ways:
the new epoch as the agent takes it (the previous block kept, the edited
file appended in an update section: agent/core/context/update.py); the
block rendered again in the stable order (ordering.py), what a new epoch
did before and still does past the superseded-copy bound; and the earlier
layout (files by path, the epoch number in the header), which this script
reproduces for the comparison.

    python bench/epoch_prefix.py [--files 30]

Prints JSON: per case, cached tokens, prompt tokens and the share.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import prompts  # noqa: E402
from agent.core.context import take_snapshot  # noqa: E402
from agent.core.context.snapshot import render_file  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402

MODEL = "smollm2-135m-instruct"


def make_repository(root: Path, count: int) -> list[str]:
    """`count` small modules committed one per commit, oldest first; their names by age."""
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    names = []
    for index in range(count):
        name = f"pkg/module_{(index * 7) % count:02d}.py"  # ages unrelated to path order
        body = "\n".join(
            f"def function_{index}_{n}(value):\n    return value * {n} + {index}\n"
            for n in range(6)
        )
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(f'"""Module {index}."""\n\n{body}')
        when = 1_700_000_000 + index * 3600
        env = {
            **os.environ,
            "GIT_AUTHOR_DATE": f"{when} +0000",
            "GIT_COMMITTER_DATE": f"{when} +0000",
            "GIT_AUTHOR_NAME": "bench",
            "GIT_AUTHOR_EMAIL": "bench@example.com",
            "GIT_COMMITTER_NAME": "bench",
            "GIT_COMMITTER_EMAIL": "bench@example.com",
        }
        subprocess.run(["git", "add", name], cwd=root, check=True, env=env)
        subprocess.run(["git", "commit", "-q", "-m", name], cwd=root, check=True, env=env)
        names.append(name)
    return names


def legacy_text(snapshot) -> str:
    """The earlier layout: files by path, epoch and count in the header."""
    files = sorted(snapshot.all_files, key=lambda f: f.path)
    header = f'<repository root="repo" epoch="{snapshot.epoch}" files="{len(files)}">\n'
    return header + "".join(render_file(f) for f in files) + "</repository>\n"


def prompt(system: str, snapshot_text: str) -> str:
    return f"{system}\n{snapshot_text}\nUser: rename value to amount everywhere.\nAssistant:"


def cached_share(llm: LLM, column: str, first: str, second: str) -> dict:
    """`column` leads both prompts, so no measurement is served from another's pages
    (the kept and rendered-again texts are the same when the edit is at the tail)."""
    params = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate([f"{column}\n{first}"], params)
    out = llm.generate([f"{column}\n{second}"], params)[0]
    total = len(out.prompt_token_ids)
    return {
        "cached_tokens": out.num_cached_tokens,
        "prompt_tokens": total,
        "share": round(out.num_cached_tokens / total, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=30)
    args = parser.parse_args()
    llm = LLM(MODEL)

    def token_counter(text: str) -> int:
        return len(llm.tokenizer.encode(text))

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, pick in (("newest", -1), ("middle", args.files // 2), ("oldest", 0)):
            root = Path(tmp) / label / "repo"
            root.mkdir(parents=True)
            names = make_repository(root, args.files)
            system = prompts.load("system", workspace=str(root))
            first = take_snapshot(root, 1, 100_000, token_counter)
            edited = names[pick]
            path = root / edited
            path.write_text(path.read_text().replace("return value * 3", "return value * 33"))
            second = take_snapshot(root, 2, 100_000, token_counter, previous=first)
            again = take_snapshot(
                root, 2, 100_000, token_counter, previous=first, max_superseded=None
            )
            ours = cached_share(
                llm, "kept", prompt(system, first.text), prompt(system, second.text)
            )
            rendered = cached_share(
                llm, "again", prompt(system, first.text), prompt(system, again.text)
            )
            old = cached_share(
                llm,
                "legacy",
                prompt(system, legacy_text(first)),
                prompt(system, legacy_text(second)),
            )
            position = [f.path for f in first.files].index(edited)
            results.append(
                {
                    "edited": label,
                    "position_in_new_order": position,
                    "position_by_path": sorted(names).index(edited),
                    "kept_with_update": ours,
                    "stable_order_rendered_again": rendered,
                    "path_order_epoch_in_header": old,
                }
            )
    print(json.dumps({"model": MODEL, "files": args.files, "results": results}, indent=2))


if __name__ == "__main__":
    main()
