"""How many approval prompts a scripted session's shell commands raise. Prints JSON.

The session is the shell side of a typical task on a Python repository:
looking around, reading, searching, inspecting git, running the tests,
installing, cleaning up. Each command is judged by the permission policy in
`ask` mode (the TUI's default), as the agent would judge it. Run it against
another checkout to compare (the policy then has no sandbox notion):

    python bench/approval_prompts.py
    PYTHONPATH=/path/to/old/checkout python bench/approval_prompts.py
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
from pathlib import Path

from tools import ApprovalMode, PermissionPolicy, default_registry

SESSION = [
    "ls",
    "ls -la src tests",
    "cat README.md",
    "cat src/app.py | head -50",
    "find . -name '*.py' -not -path './.venv/*'",
    "tree -L 2",
    "wc -l src/*.py",
    "grep -rn 'def main' src",
    "grep -rn TODO --include='*.py' .",
    "rg -n 'import requests' src tests",
    "git status",
    "git diff",
    "git log --oneline -10",
    "git --no-pager log -p -1 -- src/app.py",
    "git show HEAD --stat",
    "git blame src/app.py | head -20",
    "git diff HEAD~1 -- src",
    "echo $PATH",
    "ls $HOME",
    "cat $(git ls-files | grep -m1 setup)",
    "head -n 20 $(find src -name '*.py' | head -3)",
    "grep -c test tests/*.py 2>/dev/null",
    "ls ../",
    "cat ~/.gitconfig",
    "diff src/app.py src/app_old.py",
    "sort requirements.txt | uniq -c",
    "cd src && ls && cat app.py",
    "file src/*",
    "du -sh .",
    "which python3",
    "python3 --version",
    "python3 -m pytest -q",
    "pytest tests/test_app.py -x",
    "make test",
    "pip install -e .",
    "python3 -c 'import src.app'",
    "rm -rf build",
    "mkdir -p build && cp src/app.py build/",
    "ruff check .",
    "git add -A && git commit -m wip",
]


def main() -> None:
    workspace = Path(tempfile.mkdtemp(prefix="resident-prompts-"))
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("def main():\n    pass\n")
    registry = default_registry()
    sandbox_aware = "sandboxed" in inspect.signature(PermissionPolicy).parameters
    variants = {"sandboxed": True, "no_sandbox": False} if sandbox_aware else {"parser_only": None}
    report: dict[str, object] = {"commands": len(SESSION), "mode": "ask", "variants": {}}
    for name, sandboxed in variants.items():
        kwargs = {} if sandboxed is None else {"sandboxed": sandboxed}
        policy = PermissionPolicy(ApprovalMode.ASK, workspace=workspace, **kwargs)
        asks, denies = [], []
        for command in SESSION:
            call = registry.parse("shell", {"command": command})
            verdict = policy.check(call).verdict.value
            (asks if verdict == "ask" else denies if verdict == "deny" else []).append(command)
        report["variants"][name] = {  # type: ignore[index]
            "prompts": len(asks),
            "denied": len(denies),
            "ran_unasked": len(SESSION) - len(asks) - len(denies),
            "asked": asks,
        }
    report["tools_package"] = os.path.dirname(inspect.getfile(PermissionPolicy))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
