"""Where things live (issue 39), checked on the source of the whole tree.

- no circles anywhere: every top-level folder with Python in it, bench/ and
  tests/ included (tests/test_import_rules.py covers the shipped packages);
- the sandbox's vocabulary (tools/sandbox/grants.py) sits below its
  implementations: it imports none, and whoever only names a grant or a
  setting takes it from there, not from bubblewrap;
- streamed model output has one vocabulary (engine/chat/events.py): each of its
  names is defined once, the agent's clients stream those classes, and the
  client-only names it replaced stay gone;
- developer tools (engine/devtools) stand apart from the runtime: nothing that
  serves a request imports them.
"""

from __future__ import annotations

import ast
import functools
import typing
from pathlib import Path

from tests import import_graph

ROOT = Path(__file__).resolve().parents[1]
EVERYWHERE = import_graph.top_level_packages()


def _within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@functools.cache  # the whole tree's graph, read once for every check below
def _edges():
    return import_graph.imports(packages=EVERYWHERE)


# -- circles ----------------------------------------------------------------------------


def test_every_top_level_folder_is_read():
    """The checks below would pass on a tree they never read."""
    assert {"engine", "agent", "tools", "prompts", "bench", "tests"} <= set(EVERYWHERE)
    sources = {edge.source for edge in _edges()}
    assert "bench.gpu_check" in sources and "tests.test_layout_rules" in sources


def test_no_import_circles_anywhere():
    """Counting imports inside functions: bench/gpu_check.py imports gpu_check_quick.py
    to run `--quick`, so gpu_check_quick.py takes what both need from a third module."""
    assert import_graph.circles(_edges()) == [], "break by moving what both need below"


# -- the sandbox's vocabulary -----------------------------------------------------------

GRANTS = "tools.sandbox.grants"
VOCABULARY = {"READ_ONLY", "SandboxGrant", "SandboxSettings", "SandboxError", "CommandSandbox"}


def test_the_sandbox_vocabulary_imports_no_implementation():
    path = ROOT / "tools" / "sandbox" / "grants.py"
    modules = [module for module, *_ in import_graph.raw_imports(path)]
    assert [m for m in modules if _within(m, "tools", "agent", "engine")] == []


def test_the_vocabulary_is_defined_in_its_module_only():
    assert _top_level_definitions(VOCABULARY) == {name: [GRANTS] for name in VOCABULARY}


def test_grants_and_settings_are_taken_from_the_vocabulary():
    """bubblewrap uses the words itself, so they would import from there too; they must
    not, or a tool that only names a grant depends on how commands are confined."""
    offenders = []
    for package in EVERYWHERE:
        for path in import_graph.sources(package):
            for module, names, *_ in import_graph.raw_imports(path):
                if module == "tools.sandbox.bubblewrap" and VOCABULARY & set(names):
                    offenders.append(f"{import_graph.module_of(path)}: {sorted(names)}")
    assert offenders == []


def test_what_every_tool_shares_knows_no_sandbox_implementation():
    """tools/base.py and tools/context.py are below every tool: they name the vocabulary."""
    for name in ("base", "context"):
        modules = [m for m, *_ in import_graph.raw_imports(ROOT / "tools" / f"{name}.py")]
        assert GRANTS in modules
        assert [m for m in modules if _within(m, "tools.sandbox") and m != GRANTS] == []


# -- streamed model output --------------------------------------------------------------

STREAMED = {"ContentDelta", "ReasoningDelta", "ToolCallDelta", "ToolCallEnd", "ToolCallError"}
# The agent's events for the same output: their own names, one class each.
AGENT_EVENTS = {"TextDelta", "ReasoningDeltaEvent", "ToolCallEvent"}
# The agent's clients once had words of their own for the same pieces.
RETIRED = {"TextChunk", "ReasoningChunk", "ToolCallChunk", "ToolCallProblem"}


@functools.cache
def _definitions() -> list[tuple[str, str]]:
    """(name, module) for what every module of the tree defines at its top level: a
    class, or an assignment such as `READ_ONLY = SandboxGrant()`."""
    found = []
    for package in EVERYWHERE:
        for path in import_graph.sources(package):
            module = import_graph.module_of(path)
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.ClassDef):
                    found.append((node.name, module))
                elif isinstance(node, ast.Assign):
                    found += [(t.id, module) for t in node.targets if isinstance(t, ast.Name)]
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    found.append((node.target.id, module))
    return found


def _top_level_definitions(names: set[str]) -> dict[str, list[str]]:
    """For each of `names` defined anywhere, the modules that define it."""
    found: dict[str, list[str]] = {}
    for name, module in _definitions():
        if name in names:
            found.setdefault(name, []).append(module)
    return found


def test_each_streamed_output_name_is_defined_once():
    defined = _top_level_definitions(STREAMED | AGENT_EVENTS | RETIRED)
    assert {name: defined.get(name) for name in STREAMED} == {
        name: ["engine.chat.events"] for name in STREAMED
    }
    assert {name: defined.get(name) for name in AGENT_EVENTS} == {
        name: ["agent.core.events"] for name in AGENT_EVENTS
    }
    assert {name: defined[name] for name in RETIRED if name in defined} == {}


def test_the_clients_stream_the_engines_words():
    from agent.core import clients
    from engine.chat import events

    items = set(typing.get_args(clients.StreamItem))
    words = {events.ContentDelta, events.ReasoningDelta, events.ToolCall, events.ToolCallError}
    assert items == words | {clients.Completion}


# -- developer tools --------------------------------------------------------------------


def test_nothing_on_the_serving_path_imports_the_developer_tools():
    """engine/devtools holds test checkpoints, the compile check and `resident bench`'s
    measurements; only the bench command (engine/cli/bench.py) reaches into it."""
    users = {
        edge.source
        for edge in import_graph.imports()
        if _within(edge.target, "engine.devtools")
        and not _within(edge.source, "engine.devtools", "engine.cli.bench")
    }
    assert users == set()


def test_the_developer_tools_are_not_among_the_runtime_packages():
    engine = ROOT / "engine"
    for moved in ("testing", "kernel_check", "benchmarks"):
        assert not (engine / moved).exists()
    assert (engine / "devtools" / "benchmarks" / "families.py").is_file()
    assert (engine / "devtools" / "testing" / "__init__.py").is_file()
    assert (engine / "devtools" / "kernel_check" / "__main__.py").is_file()
