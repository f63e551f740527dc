"""DESIGN.md §1, who may import whom, checked on the source of every package.

- no module imports itself back through others (no circles, counting imports inside
  functions and under TYPE_CHECKING: a circle only a function-level import breaks
  is still one), and the engine's packages depend on one another one way;
- inside the engine: its root holds only the public faces; models know layers and
  weights, not scheduling; kv knows pages, dtypes and scales, not models; the
  scheduler knows requests and pages, not tensors; the server knows HTTP and the
  async engine; kernels know no layer or model;
- engine imports nothing from agent, tools or prompts;
- tools imports nothing from engine or agent;
- in agent, only the clients (agent/core/clients) and the CLI import the engine;
- the agent's core imports no front end; front ends import no other front
  end (the CLI, which starts them all, and the shared agent_thread aside);
- no module imports another package's private (underscore) names.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests import import_graph

ROOT = Path(__file__).resolve().parents[1]
FRONT_ENDS = ("agent.tui", "agent.repl", "agent.headless", "agent.acp")
# What front ends share: the core, and helpers that hold no agent logic.
SHARED_BY_FRONT_ENDS = (
    "agent.core",
    "agent.agent_thread",
    "agent.exit_codes",
    "agent.event_printers",
    "agent.terminal_text",
)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) for every import in the file, relative ones resolved."""
    return [(module, names) for module, names, *_ in import_graph.raw_imports(path)]


def _within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _offenders(package: str, forbidden, exempt=()) -> list[str]:
    offenders = []
    for path in import_graph.sources(package):
        here = import_graph.module_of(path)
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
        for path in import_graph.sources(package):
            here = import_graph.module_of(path)
            top = ".".join(here.split(".")[:2])
            for module, names in _imports(path):
                if _within(module, top) or not _within(module, "engine", "tools", "agent"):
                    continue
                offenders += [f"{here} imports {module}.{n}" for n in names if n.startswith("_")]
    assert offenders == []


def test_the_rules_see_imports():
    """The checks above would pass on an empty tree; make sure they read real imports."""
    modules = {m for path in import_graph.sources("agent/core") for m, _ in _imports(path)}
    assert "agent.core.clients" in modules and "tools" in modules


# -- the graph as a whole ---------------------------------------------------------------


def test_no_import_circles():
    circles = import_graph.circles(import_graph.imports())
    assert circles == [], "modules that import each other (break by moving what both need below)"


def _engine_package(module: str) -> str | None:
    """The engine's package a module belongs to (`kv`, `core`, ...), or its root module."""
    parts = module.split(".")
    if parts[0] != "engine" or len(parts) == 1:
        return None
    return parts[1]


def _engine_package_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for edge in import_graph.imports():
        here, there = _engine_package(edge.source), _engine_package(edge.target)
        if here and there and here != there:
            found.setdefault(here, set()).add(there)
    return found


def test_engine_packages_depend_one_way():
    packages = _engine_package_imports()
    edges = [
        import_graph.Import(a, b, 0, False, False)
        for a, targets in packages.items()
        for b in targets
    ]
    assert import_graph.circles(edges) == []


def test_engine_root_holds_only_the_public_faces():
    root = ROOT / "engine"
    loose = sorted(p.stem for p in root.glob("*.py"))
    assert loose == ["__init__", "__main__", "async_engine", "config", "errors", "llm"]


def test_tools_are_packages_by_concern():
    loose = sorted(p.stem for p in (ROOT / "tools").glob("*.py"))
    assert loose == ["__init__", "base", "context", "schema"]


# What each package inside the engine may not import (DESIGN.md §1), by package name.
ENGINE_RULES = {
    # models know layers and weights, not scheduling or serving
    "models": {
        "core",
        "execution",
        "distributed",
        "requests",
        "sampling",
        "speculative",
        "server",
        "llm",
        "async_engine",
    },
    # kv knows pages, dtypes and scales, not models
    "kv": {
        "models",
        "layers",
        "attention",
        "execution",
        "core",
        "requests",
        "sampling",
        "server",
        "llm",
        "async_engine",
        "weights",
        "model_files",
    },
    # the layers know their kernels, not the models built from them
    "layers": {"models", "execution", "core", "requests", "server", "llm", "async_engine"},
    "weights": {"layers", "models", "execution", "core", "server", "llm"},
    "model_files": {"weights", "layers", "models", "execution", "core", "server", "llm"},
    # kernels are leaves: they know tensors, not layers or models
    "cpu_kernels": {"layers", "models", "execution", "core", "server", "llm"},
    "gpu_kernels": {"layers", "models", "execution", "core", "server", "llm"},
    # the server knows HTTP and the async engine, not what runs underneath
    "server": {
        "core",
        "execution",
        "models",
        "layers",
        "kv",
        "attention",
        "weights",
        "cpu_kernels",
        "gpu_kernels",
        "sampling",
        "speculative",
    },
    # chat text (templates, tool calls, reasoning) knows no tensors
    "chat": {"grammar", "core", "execution", "models", "layers", "kv", "server"},
    "rendering": {"core", "execution", "models", "layers", "kv", "server"},
    "tokenizers": {"core", "execution", "models", "layers", "kv", "server", "chat"},
}


def test_engine_packages_keep_to_their_concern():
    packages = _engine_package_imports()
    broken = {
        package: sorted(packages.get(package, set()) & forbidden)
        for package, forbidden in ENGINE_RULES.items()
        if packages.get(package, set()) & forbidden
    }
    assert broken == {}


def test_the_scheduler_knows_requests_and_pages_not_tensors():
    """engine/core/scheduler.py decides from counts of tokens and pages; torch is the runner's."""
    modules = {m for m, _ in _imports(ROOT / "engine" / "core" / "scheduler.py")}
    assert not any(_within(m, "torch", "engine.models", "engine.layers") for m in modules)


def test_the_engine_rules_see_imports():
    """The rules above would pass on an empty tree or on misspelt names."""
    packages = _engine_package_imports()
    assert "kv" in packages["layers"] and "collectives" in packages["kv"]
    named = set(ENGINE_RULES).union(*ENGINE_RULES.values())
    engine = ROOT / "engine"
    assert [
        n for n in named if not (engine / n).is_dir() and not (engine / f"{n}.py").is_file()
    ] == []


def test_the_readme_lists_every_engine_package_in_an_order_the_imports_keep():
    """README's Layout table names the packages bottom up: none imports one listed later."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| `host/` |") : text.index("`agent/core/` the agent")]
    order = [
        name
        for line in table.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`(\w+)/`", line.split("|")[1])
    ]
    packages = {p.name for p in (ROOT / "engine").iterdir() if (p / "__init__.py").is_file()}
    assert sorted(order) == sorted(packages)
    position = {name: i for i, name in enumerate(order)}
    upward = [
        f"{a} -> {b}"
        for a, targets in _engine_package_imports().items()
        for b in targets
        if a in position and b in position and position[b] > position[a]
    ]
    assert upward == []
