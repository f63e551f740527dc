"""The project's import graph, read from source: who imports whom, where, and the circles.

An edge goes from a module to the most specific project module an import names
(`from engine.kv import pool` is an edge to `engine.kv.pool` when that module
exists). Package `__init__` files that Python runs on the way are not edges:
they would make every package a circle with its own members.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "tools", "agent", "prompts")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the project module imported
    line: int
    in_function: bool  # inside a def: runs when called, not when the module loads
    type_checking: bool  # under `if TYPE_CHECKING:`: never runs


def module_of(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(package: str, root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)


def top_level_packages(root: Path = ROOT) -> tuple[str, ...]:
    """Every top-level folder that holds Python source: the shipped packages, bench/, tests/."""
    return tuple(
        sorted(
            d.name
            for d in root.iterdir()
            if d.is_dir() and not d.name.startswith(".") and sources(d.name, root)
        )
    )


def project_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    return {module_of(p, root): p for pkg in packages for p in sources(pkg, root)}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def raw_imports(path: Path, root: Path = ROOT):
    """(module, names, line, in_function, type_checking) for each import, relative ones resolved."""
    here = module_of(path, root)
    found = []

    def visit(node, in_function, type_checking):
        for child in ast.iter_child_nodes(node):
            inner_fn = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            inner_tc = type_checking or (
                isinstance(child, ast.If) and _is_type_checking(child.test)
            )
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append((alias.name, [], child.lineno, in_function, type_checking))
            elif isinstance(child, ast.ImportFrom):
                module = child.module or ""
                if child.level:
                    base = here.split(".")
                    base = base[: len(base) - child.level + (path.name == "__init__.py")]
                    module = ".".join([*base, module] if module else base)
                names = [alias.name for alias in child.names]
                found.append((module, names, child.lineno, in_function, type_checking))
            visit(child, inner_fn, inner_tc)

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return found


def imports(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    """Every edge among `packages` (the shipped ones unless told; tests/test_layout_rules.py
    passes every top-level folder, bench/ and tests/ included)."""
    modules = project_modules(root, packages)
    edges = []
    for here, path in modules.items():
        for module, names, line, in_fn, tc in raw_imports(path, root):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
            if len(targets) < len(names) or not names:
                # some names are attributes of `module` itself
                probe = module
                while probe and probe not in modules:
                    probe = probe.rpartition(".")[0]
                if probe:
                    targets.append(probe)
            edges += [Import(here, t, line, in_fn, tc) for t in targets if t != here]
    return edges


def circles(edges: list[Import]) -> list[list[str]]:
    """Strongly connected groups of more than one module.

    Imports under `if TYPE_CHECKING:` count: a circle only types can see is still
    two modules that cannot be understood apart.
    """
    graph: dict[str, set[str]] = {}
    for e in edges:
        if True:
            graph.setdefault(e.source, set()).add(e.target)
            graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        # iterative Tarjan: (node, iterator over its successors)
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def layout_report(root: Path = ROOT) -> dict:
    """The figures issue 27 asked for, for the tree at `root` (`python -m tests.import_graph`)."""
    edges = imports(root)
    inside = [
        module
        for module, path in project_modules(root).items()
        for *_, in_function, _ in raw_imports(path, root)
        if in_function
    ]
    tools = root / "tools"
    return {
        "engine_root_modules": sorted(
            p.stem for p in (root / "engine").glob("*.py") if p.stem not in ("__init__", "__main__")
        ),
        "tools_files_per_folder": {
            str(d.relative_to(root)): len(list(d.glob("*.py")))
            for d in sorted([tools, *tools.iterdir()])
            if d.is_dir() and any(d.glob("*.py"))
        },
        "circles": circles(edges),
        "circles_everywhere": circles(imports(root, top_level_packages(root))),
        "imports_inside_functions": len(inside),
        "imports_inside_functions_engine": sum(m.startswith("engine") for m in inside),
        "of_project_modules": sum(e.in_function for e in edges),
    }


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(layout_report(Path(sys.argv[1]).resolve() if sys.argv[1:] else ROOT)))
