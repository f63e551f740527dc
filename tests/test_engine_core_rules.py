"""Issue 39's rules for the engine's core, checked on the source:

- the step loop stays small: LLMEngine keeps the loop and delegates each stage of
  a request (engine/core: intake, output processor, set-up, stats) to its own file;
- no function takes an untyped engine: a parameter named `engine` (or
  `async_engine`, ...) carries a type, never `Any`, so following a request from the
  server down never stops at an unknown object;
- nothing rewires another object from below: no assignment through a parameter
  into the objects it holds (`engine.prefix_cache.spill = ...`). The owner wires
  what it builds (engine/core/prefix_tiers.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests import import_graph

ROOT = Path(__file__).resolve().parents[1]
LLM_ENGINE = ROOT / "engine" / "core" / "llm_engine.py"

# Lines, counted from `def`/`class` to the last line of the body.
STEP_MAX_LINES = 40
LLM_ENGINE_MAX_LINES = 130
CORE_FILE_MAX_LINES = 400
# Engine packages llm_engine.py may import besides engine.core (config, errors,
# requests today): set-up, intake, outputs and stats import the rest.
LLM_ENGINE_MAX_PACKAGES = 4
# Where no assignment may reach through a parameter into the objects it holds.
NO_REWIRING_IN = ("engine/core", "engine/kv", "engine/server", "engine/execution")
ENGINE_PARAMETER = re.compile(r"(^|_)engine$")
# Typed in the change that moves the test and benchmark helpers apart (issue 39,
# item 5): (file name, function). Empty this once they carry a type.
UNTYPED_ENGINE_ELSEWHERE: set[tuple[str, str]] = set()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    args = function.args
    extra = [a for a in (args.vararg, args.kwarg) if a is not None]
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *extra]


# -- the step loop -----------------------------------------------------------------------


def _llm_engine_class() -> ast.ClassDef:
    classes = [n for n in _tree(LLM_ENGINE).body if isinstance(n, ast.ClassDef)]
    return next(c for c in classes if c.name == "LLMEngine")


def test_the_step_loop_stays_small():
    engine = _llm_engine_class()
    step = next(f for f in engine.body if isinstance(f, ast.FunctionDef) and f.name == "step")
    assert _lines(step) <= STEP_MAX_LINES, "LLMEngine.step: move a stage out (engine/core)"
    assert _lines(engine) <= LLM_ENGINE_MAX_LINES, "LLMEngine keeps the loop and delegates"


def test_the_step_loop_imports_few_packages():
    packages = set()
    for module, *_ in import_graph.raw_imports(LLM_ENGINE):
        parts = module.split(".")
        if parts[0] == "engine" and len(parts) > 1 and parts[1] != "core":
            packages.add(parts[1])
    assert len(packages) <= LLM_ENGINE_MAX_PACKAGES, sorted(packages)


def test_core_files_stay_under_the_size_bound():
    long = {
        str(p.relative_to(ROOT)): n
        for p in import_graph.sources("engine/core")
        if (n := len(p.read_text().splitlines())) > CORE_FILE_MAX_LINES
    }
    assert long == {}


# -- typed engines -------------------------------------------------------------------------


def untyped_engine_parameters(path: Path) -> list[str]:
    """`file:line function(parameter)` for each engine parameter without a type or typed Any."""
    found = []
    for function in _functions(_tree(path)):
        for arg in _parameters(function):
            if not ENGINE_PARAMETER.search(arg.arg):
                continue
            annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            if not annotation or re.search(r"\bAny\b", annotation):
                found.append(f"{path.name}:{function.lineno} {function.name}({arg.arg})")
    return found


def test_no_function_takes_an_untyped_engine():
    offenders = []
    for path in import_graph.sources("engine"):
        for found in untyped_engine_parameters(path):
            name = found.split(" ")[1].split("(")[0]
            if (path.name, name) not in UNTYPED_ENGINE_ELSEWHERE:
                offenders.append(str(path.relative_to(ROOT)) + found.removeprefix(path.name))
    assert offenders == []


def test_the_engine_parameter_check_sees_them(tmp_path):
    source = tmp_path / "old.py"
    source.write_text(
        "from typing import Any\n"
        "def a(engine): ...\n"
        "def b(engine: Any, n: int): ...\n"
        "def c(async_engine: Any | None = None): ...\n"
        "def d(engine: 'LLMEngine'): ...\n"
        "def e(engine_settings: dict): ...\n"
    )
    assert [f.split(" ")[1] for f in untyped_engine_parameters(source)] == [
        "a(engine)",
        "b(engine)",
        "c(async_engine)",
    ]


# -- no rewiring from below ------------------------------------------------------------------


def _attribute_depth(target: ast.expr) -> tuple[str | None, int]:
    """(the name an attribute chain starts from, how many attributes deep)."""
    depth = 0
    while isinstance(target, ast.Attribute):
        target, depth = target.value, depth + 1
    return (target.id if isinstance(target, ast.Name) else None), depth


def _assigned(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    else:
        return []
    flat = []
    for target in targets:
        flat += target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
    return flat


def rewiring(source: str, filename: str = "<source>") -> list[str]:
    """Assignments that reach through a parameter into an object it holds: `p.a.b = x`
    for a parameter `p`, or `self.a.b.c = x` (`self.a.b = x` sets a part of one's own),
    and `setattr(p.a, ...)`. Setting an attribute of the parameter itself (`seq.text =
    ...`) is how a step updates the object it was handed, and is allowed."""
    found = []
    for function in _functions(ast.parse(source, filename)):
        params = {a.arg for a in _parameters(function)}
        for node in ast.walk(function):
            targets = _assigned(node)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "setattr"
                and node.args
            ):
                targets = [ast.Attribute(value=node.args[0], attr="?")]
            for target in targets:
                root, depth = _attribute_depth(target)
                if root in params and depth >= (3 if root in ("self", "cls") else 2):
                    found.append(f"{filename}:{node.lineno} {ast.unparse(target)}")
    return found


def test_nothing_rewires_another_object_from_below():
    offenders = []
    for folder in NO_REWIRING_IN:
        for path in import_graph.sources(folder):
            offenders += rewiring(path.read_text(), str(path.relative_to(ROOT)))
    assert offenders == []


def test_the_rewiring_check_sees_the_old_spill_hook():
    """engine/kv/prefix_spill.py before issue 39 hooked itself into its engine's parts."""
    old = (
        "def open_prefix_spill(engine):\n"
        "    if engine.prefix_cache is None:\n"
        "        return None\n"
        "    spill = PrefixSpill(engine, host_budget_bytes(engine.config, engine.device.type))\n"
        "    engine.prefix_cache.spill = spill.spill\n"
        "    engine.scheduler.restore = spill.restore\n"
        "    return spill\n"
        "class Tier:\n"
        "    def hook(self, cache):\n"
        "        self.engine.scheduler.restore = self.restore\n"
        "        setattr(cache.tree, 'spill', self.spill)\n"
        "        self.count = 0\n"  # its own attribute
        "        self.stats.count = 0\n"  # a part of its own
        "    def step(self, seq):\n"
        "        seq.text = ''\n"  # the object it was handed
    )
    assert [f.split(" ")[1] for f in rewiring(old)] == [
        "engine.prefix_cache.spill",
        "engine.scheduler.restore",
        "self.engine.scheduler.restore",
        "cache.tree.?",
    ]
