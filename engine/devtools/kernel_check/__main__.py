"""`python -m engine.devtools.kernel_check`: compile every engine kernel for Hopper, print the table.

Exit status 1 when a launch fails (see verdict.py), 2 when Triton is
missing. `--json PATH` writes the whole report (every row with its
registers, spilled bytes, shared memory, config and the deployments that
launch it). Runs on any machine; a GPU is neither needed nor used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.devtools.kernel_check", description=__doc__
    )
    parser.add_argument("--json", type=Path, help="write the report here as JSON")
    parser.add_argument("--jobs", type=int, default=None, help="compile workers (default: CPUs)")
    parser.add_argument("--no-cache", action="store_true", help="compile everything again")
    parser.add_argument("--gpu", choices=("h200", "b200"), action="append",
                        help="only these GPUs (default: H200, and B200 where Triton can)")  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    args = parser.parse_args(argv)
    # Kernels must be JITFunctions, which Triton makes only outside its interpreter;
    # the flag is read when a kernel module is first imported, below.
    os.environ.pop("TRITON_INTERPRET", None)
    try:
        import triton  # noqa: F401
    except ImportError:
        print("the compile check needs triton (pip install triton)", file=sys.stderr)
        return 2
    from engine.devtools.kernel_check.check import failed, run_check
    from engine.devtools.kernel_check.gpus import B200, H200
    from engine.devtools.kernel_check.verdict import summary, table

    gpus = [{"h200": H200, "b200": B200}[name] for name in args.gpu] if args.gpu else None
    report = run_check(gpus, args.jobs, use_cache=not args.no_cache)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    if args.quiet:
        for line in table(report).splitlines():
            if line.startswith("FAILED"):
                print(line)
        print(summary(report))
    else:
        print(table(report))
    return 1 if failed(report) else 0


if __name__ == "__main__":
    sys.exit(main())
