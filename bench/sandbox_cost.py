"""What the sandbox costs per shell command. Prints JSON.

Runs the same commands through the shell tool without a sandbox, in the
sandbox with a read-only grant (a command nobody approved: the secret scan
runs too) and with a write grant, interleaved so machine noise hits all
three alike. Reports the median and p90 wall time per command and the
sandboxed/unsandboxed ratios, plus the secret scan alone on the workspace.

    python bench/sandbox_cost.py [--runs 50] [--workspace .]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from tools import ToolContext, default_registry
from tools.sandbox.bubblewrap import SandboxUnavailable, detect_sandbox
from tools.sandbox.grants import READ_ONLY, SandboxGrant
from tools.sandbox.mounts import secret_files

COMMANDS = {"true": "true", "cat": "cat README.md > /dev/null", "git_status": "git status --short"}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--workspace", default=".")
    args = parser.parse_args()
    workspace = Path(os.path.realpath(args.workspace))
    sandbox = detect_sandbox(workspace)
    if isinstance(sandbox, SandboxUnavailable):
        raise SystemExit(f"no sandbox here: {sandbox.reason}")
    registry = default_registry()
    variants = {
        "none": (ToolContext(workspace=workspace), READ_ONLY),
        "read_only": (ToolContext(workspace=workspace, sandbox=sandbox), READ_ONLY),
        "write": (ToolContext(workspace=workspace, sandbox=sandbox), SandboxGrant(write=True)),
    }
    times: dict[str, dict[str, list[float]]] = {n: {v: [] for v in variants} for n in COMMANDS}
    for _ in range(args.runs):
        for name, command in COMMANDS.items():
            for variant, (ctx, grant) in variants.items():
                started = time.perf_counter()
                result = registry.call("shell", {"command": command}, ctx, grant)
                times[name][variant].append(time.perf_counter() - started)
                if not result.ok:
                    raise SystemExit(f"{variant} {command!r} failed: {result.output}")
    report: dict[str, object] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "sandbox": sandbox.describe(),
        "runs": args.runs,
        "workspace": str(workspace),
        "commands": {},
    }
    for name, by_variant in times.items():
        medians = {v: statistics.median(t) * 1000 for v, t in by_variant.items()}
        report["commands"][name] = {  # type: ignore[index]
            "median_ms": {v: round(m, 2) for v, m in medians.items()},
            "p90_ms": {v: round(_percentile(t, 0.9) * 1000, 2) for v, t in by_variant.items()},
            "added_ms": {v: round(medians[v] - medians["none"], 2) for v in ("read_only", "write")},
        }
    scans = []
    for _ in range(10):
        started = time.perf_counter()
        found, complete = secret_files(workspace)
        scans.append(time.perf_counter() - started)
    report["secret_scan"] = {
        "median_ms": round(statistics.median(scans) * 1000, 2),
        "found": len(found),
        "complete": complete,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
