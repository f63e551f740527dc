"""DESIGN.md §1, who may import whom, checked on the source of every package.

- engine imports nothing from agent, tools or prompts;
- tools imports nothing from engine or agent;
- in agent, only the clients (agent/core/clients) and the CLI import the engine;
- the agent's core imports no front end; front ends import no other front
  end (the CLI, which starts them all, and the shared agent_thread aside);
- no module imports another package's private (underscore) names.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRONT_ENDS = ("agent.tui", "agent.repl", "agent.headless", "agent.acp")
# What front ends share: the core, and helpers that hold no agent logic.
SHARED_BY_FRONT_ENDS = (
    "agent.core",
    "agent.agent_thread",
    "agent.exit_codes",
    "agent.event_printers",
)


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) for every import in the file, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = _module_of(path).split(".")
                base = base[: len(base) - node.level + (path.name == "__init__.py")]
                module = ".".join([*base, module] if module else base)
            found.append((module, [alias.name for alias in node.names]))
    return found


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _offenders(package: str, forbidden, exempt=()) -> list[str]:
    offenders = []
    for path in _sources(package):
        here = _module_of(path)
        if _within(here, *exempt):
            continue
        for module, _ in _imports(path):
            if forbidden(here, module):
                offenders.append(f"{here} imports {module}")
    return offenders


def test_the_engine_stands_alone():
    assert _offenders("engine", lambda _, m: _within(m, "agent", "tools", "prompts")) == []


def test_tools_know_no_engine_and_no_agent():
    assert _offenders("tools", lambda _, m: _within(m, "engine", "agent")) == []


def test_only_the_clients_and_the_cli_import_the_engine():
    exempt = ("agent.core.clients", "agent.cli")
    assert _offenders("agent", lambda _, m: _within(m, "engine"), exempt) == []


def test_the_core_imports_no_front_end():
    forbidden = (*FRONT_ENDS, *SHARED_BY_FRONT_ENDS[1:], "agent.cli")
    offenders = _offenders("agent/core", lambda _, m: _within(m, *forbidden))
    assert offenders == []


def test_front_ends_import_no_other_front_end():
    def other_front_end(here: str, module: str) -> bool:
        if not _within(module, "agent") or _within(module, *SHARED_BY_FRONT_ENDS):
            return False
        own = next((f for f in FRONT_ENDS if _within(here, f)), None)
        return not _within(module, own) if own else False

    assert _offenders("agent", other_front_end, exempt=("agent.cli", "agent.core")) == []


def test_no_private_names_cross_a_package():
    offenders = []
    for package in ("engine", "tools", "agent"):
        for path in _sources(package):
            here = _module_of(path)
            top = ".".join(here.split(".")[:2])
            for module, names in _imports(path):
                if _within(module, top) or not _within(module, "engine", "tools", "agent"):
                    continue
                offenders += [f"{here} imports {module}.{n}" for n in names if n.startswith("_")]
    assert offenders == []


def test_the_rules_see_imports():
    """The checks above would pass on an empty tree; make sure they read real imports."""
    modules = {m for path in _sources("agent/core") for m, _ in _imports(path)}
    assert "agent.core.clients" in modules and "tools" in modules
