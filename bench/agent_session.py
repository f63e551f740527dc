"""A 5-turn agent session through the local engine: prefix-cache share and TTFT per turn.

Builds a small Python repository in a temporary folder (it fits the window, so
the snapshot is resident in full), opens the agent on it with the local engine
(full-auto approval, short answers) and asks five questions in one session.
Each task is limited to one model request, so a "turn" here is one request.
Token numbers come from the agent's own `usage` events; time to first token
runs from `turn_started` to the first `text_delta`/`reasoning_delta` (or, when
the answer has no text, to the first `tool_call`/`usage` event).

Prints one JSON object. Usage:

    OMP_NUM_THREADS=1 python bench/agent_session.py [--model NAME] [--kv fp8_e4m3 bf16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from agent.core.clients import start_local_client
from agent.core.events import Event
from agent.core.loop import AgentSettings
from agent.core.runtime import DEFAULT_MODEL, RuntimeOptions, open_runtime
from tools import ApprovalMode

TARGET_SHARE = 0.9

TASKS = [
    "What does the function `parse_line` in inventory/parser.py return?",
    "Which module computes the total value of the inventory?",
    "Is there a test for `Item.value`? Answer briefly.",
    "Name one function that could raise a ValueError.",
    "Summarise what this repository does in one sentence.",
]

FILES: dict[str, str] = {
    "README.md": """\
        # inventory

        A tiny inventory tool: reads `name,quantity,price` lines, keeps the items
        in memory and reports totals. Run the tests with `python -m pytest`.
        """,
    "inventory/__init__.py": """\
        \"\"\"A tiny inventory: items, a parser for CSV-like lines and reports.\"\"\"

        from inventory.model import Inventory, Item
        from inventory.parser import parse_file, parse_line

        __all__ = ["Inventory", "Item", "parse_file", "parse_line"]
        """,
    "inventory/model.py": """\
        \"\"\"Items and the inventory that holds them.\"\"\"

        from __future__ import annotations

        from dataclasses import dataclass, field


        @dataclass(frozen=True)
        class Item:
            name: str
            quantity: int
            price: float

            def value(self) -> float:
                \"\"\"What the items of this kind are worth together.\"\"\"
                return self.quantity * self.price

            def restocked(self, amount: int) -> Item:
                if amount < 0:
                    raise ValueError(f"cannot restock a negative amount: {amount}")
                return Item(self.name, self.quantity + amount, self.price)


        @dataclass
        class Inventory:
            items: dict[str, Item] = field(default_factory=dict)

            def add(self, item: Item) -> None:
                existing = self.items.get(item.name)
                if existing is None:
                    self.items[item.name] = item
                elif existing.price != item.price:
                    raise ValueError(f"{item.name}: price {item.price} != {existing.price}")
                else:
                    self.items[item.name] = existing.restocked(item.quantity)

            def remove(self, name: str, amount: int) -> None:
                item = self.items[name]
                if amount > item.quantity:
                    raise ValueError(f"only {item.quantity} of {name} left")
                left = item.quantity - amount
                if left == 0:
                    del self.items[name]
                else:
                    self.items[name] = Item(name, left, item.price)

            def __len__(self) -> int:
                return len(self.items)

            def names(self) -> list[str]:
                return sorted(self.items)
        """,
    "inventory/parser.py": """\
        \"\"\"Reading items from `name,quantity,price` lines.\"\"\"

        from __future__ import annotations

        from pathlib import Path

        from inventory.model import Inventory, Item


        def parse_line(line: str) -> Item | None:
            \"\"\"One item from a line; None for a blank line or a comment.\"\"\"
            line = line.strip()
            if not line or line.startswith("#"):
                return None
            parts = [part.strip() for part in line.split(",")]
            if len(parts) != 3:
                raise ValueError(f"expected name,quantity,price: {line!r}")
            name, quantity, price = parts
            return Item(name, int(quantity), float(price))


        def parse_file(path: Path) -> Inventory:
            inventory = Inventory()
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                try:
                    item = parse_line(line)
                except ValueError as err:
                    raise ValueError(f"{path}:{number}: {err}") from err
                if item is not None:
                    inventory.add(item)
            return inventory
        """,
    "inventory/report.py": """\
        \"\"\"Totals and a printable table.\"\"\"

        from __future__ import annotations

        from inventory.model import Inventory


        def total_value(inventory: Inventory) -> float:
            return sum(item.value() for item in inventory.items.values())


        def low_stock(inventory: Inventory, threshold: int = 5) -> list[str]:
            return [name for name, item in sorted(inventory.items.items()) if item.quantity < threshold]


        def table(inventory: Inventory) -> str:
            rows = [f"{'name':<20} {'qty':>5} {'price':>8} {'value':>10}"]
            for name in inventory.names():
                item = inventory.items[name]
                rows.append(f"{name:<20} {item.quantity:>5} {item.price:>8.2f} {item.value():>10.2f}")
            rows.append(f"{'total':<20} {'':>5} {'':>8} {total_value(inventory):>10.2f}")
            return "\\n".join(rows)
        """,
    "tests/test_inventory.py": """\
        import pytest

        from inventory.model import Inventory, Item
        from inventory.parser import parse_line
        from inventory.report import low_stock, total_value


        def test_parse_line():
            assert parse_line("apple, 3, 0.5") == Item("apple", 3, 0.5)
            assert parse_line("# comment") is None
            with pytest.raises(ValueError):
                parse_line("apple,3")


        def test_totals():
            inventory = Inventory()
            inventory.add(Item("apple", 3, 0.5))
            inventory.add(Item("pear", 10, 0.25))
            inventory.add(Item("apple", 1, 0.5))
            assert total_value(inventory) == 4.5
            assert low_stock(inventory) == ["apple"]


        def test_remove():
            inventory = Inventory({"apple": Item("apple", 3, 0.5)})
            inventory.remove("apple", 3)
            assert len(inventory) == 0
        """,
}


def build_repository(root: Path) -> None:
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], cwd=root, check=True)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Recorder:
    """An event sink that times each model request."""

    def __init__(self) -> None:
        self.turns: list[dict[str, Any]] = []
        self.snapshot: dict[str, Any] | None = None
        self.window: int | None = None
        self._current: dict[str, Any] | None = None

    def __call__(self, event: Event) -> None:
        now = time.perf_counter()
        kind = event.type
        if kind == "context_snapshot":
            self.snapshot = event.model_dump(exclude={"type", "seq"})
        elif kind == "session_started":
            self.window = event.context_window
        elif kind == "turn_started":
            self._current = {"start": now, "first": None, "first_kind": None}
        elif self._current is None:
            return
        elif kind in ("text_delta", "reasoning_delta", "tool_call", "usage"):
            if self._current["first"] is None:
                self._current["first"] = now
                self._current["first_kind"] = kind
            if kind == "usage":
                self._current["usage"] = event.model_dump(exclude={"type", "seq"})
        elif kind == "turn_completed":
            self._current["end"] = now
            self._current["finish_reason"] = event.finish_reason
            self.turns.append(self._current)
            self._current = None


def _wrap_renderer(client: Any, prompts: list[list[int]]) -> None:
    """Keep each request's prompt token ids, to say where consecutive prompts diverge."""
    renderer = client.renderer
    render = renderer.render

    def recording_render(messages, tools):
        rendered = render(messages, tools)
        prompts.append(list(rendered.token_ids))
        return rendered

    renderer.render = recording_render


async def run_session(model: str, kv_dtype: str, workspace: Path) -> dict[str, Any]:
    started = time.perf_counter()
    client = start_local_client(model, kv_cache_dtype=kv_dtype)
    engine_start_s = time.perf_counter() - started
    prompts: list[list[int]] = []
    _wrap_renderer(client, prompts)
    recorder = Recorder()
    options = RuntimeOptions(
        workspace=workspace,
        model=model,
        approval=ApprovalMode.FULL_AUTO,
        settings=AgentSettings(max_turns=1, max_tokens=32),
        checkpoints=False,
    )
    runtime = await open_runtime(options, [recorder], client=client, task=TASKS[0])
    outcomes = []
    try:
        for task in TASKS:
            outcome = await runtime.agent.run_task(task)
            outcomes.append(outcome.reason)
    finally:
        await runtime.close()

    turns = []
    for index, record in enumerate(recorder.turns):
        usage = record.get("usage") or {}
        prompt = usage.get("prompt_tokens")
        cached = usage.get("cached_tokens")
        row: dict[str, Any] = {
            "turn": index + 1,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "cached_share": round(cached / prompt, 4) if prompt and cached is not None else None,
            "new_tokens": prompt - cached if prompt and cached is not None else None,
            "completion_tokens": usage.get("completion_tokens"),
            "resident_tokens": usage.get("resident_tokens"),
            "ttft_s": round(record["first"] - record["start"], 4) if record["first"] else None,
            "ttft_measured_to": record["first_kind"],
            "turn_s": round(record["end"] - record["start"], 4),
            "finish_reason": record.get("finish_reason"),
        }
        if index < len(prompts):
            row["prompt_tokens_rendered"] = len(prompts[index])
            if index > 0:
                row["shared_prefix_with_previous"] = _common_prefix(
                    prompts[index - 1], prompts[index]
                )
        turns.append(row)
    later = [t["cached_share"] for t in turns[1:] if t["cached_share"] is not None]
    return {
        "kv_cache_dtype": kv_dtype,
        "engine_start_s": round(engine_start_s, 2),
        "context_window": recorder.window,
        "snapshot": recorder.snapshot,
        "task_outcomes": outcomes,
        "turns": turns,
        "min_cached_share_from_turn_2": min(later) if later else None,
        "meets_target": bool(later) and min(later) >= TARGET_SHARE,
    }


def machine_info() -> dict[str, Any]:
    import torch

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cuda": torch.cuda.is_available(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--kv", nargs="+", default=["fp8_e4m3"], help="KV cache dtypes to run")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="resident-bench-") as tmp:
        root = Path(tmp)
        # Sessions and their journals go to the temporary folder, not the user's data dir.
        os.environ["RESIDENT_DATA_DIR"] = str(root / "data")
        runs = []
        for kv in args.kv:
            workspace = root / f"repo-{kv}"
            workspace.mkdir()
            build_repository(workspace)
            runs.append(asyncio.run(run_session(args.model, kv, workspace)))
    result = {
        "benchmark": "agent_session",
        "model": args.model,
        "tasks": len(TASKS),
        "max_tokens_per_answer": 32,
        "target_cached_share_from_turn_2": TARGET_SHARE,
        "machine": machine_info(),
        "runs": runs,
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0 if all(run["meets_target"] for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
