"""The tree's shape: module size, no import cycles, and dependencies that point one way (issue 18).

The import graph is built with `ast` over the source files (no imports executed), with the layout of
setup.py: `sdk/` is `duetaspan`, `tools/` is `duetaspan.tools`, `adapters/` is `duetaspan.adapters`. Every
import counts, at module level, inside functions (late imports) and under `if TYPE_CHECKING:`, since each of
them is a dependency a reader has to follow. An edge goes to the module an import names (`from a.b import c`
goes to `a.b.c` when that is a module, else to `a.b`), not to the packages above it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

MAX_LINES = 450
ROOT = Path(__file__).resolve().parent.parent
LAYOUT = {"sdk": "duetaspan", "tools": "duetaspan.tools", "adapters": "duetaspan.adapters"}

# (package prefix, forbidden import prefixes): nothing under the first may import any of the second.
RULES: list[tuple[str, tuple[str, ...]]] = [
    (
        "duetaspan.model",
        ("pipecat", "duetaspan.pipeline", "duetaspan.router", "duetaspan.registry", "duetaspan.adapters"),
    ),
    ("duetaspan.registry", ("torch",)),
    ("duetaspan.router", ("duetaspan.adapters",)),
    ("duetaspan.registry", ("duetaspan.adapters",)),
    ("duetaspan.spans", ("duetaspan.adapters",)),
]


def source_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every .py file of the three source folders."""
    modules: dict[str, Path] = {}
    for folder, package in LAYOUT.items():
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def imports(module: str, path: Path) -> Iterator[tuple[str, str | None]]:
    """Every import in the file, anywhere in it, as (absolute `from` part or module, imported name or None)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield base, alias.name


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module `name` is in (None: not one of ours)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name if name in modules else None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the duetaspan modules it imports."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for base, name in imports(module, path):
            full = f"{base}.{name}" if name is not None else base
            target = full if full in modules else _owner(base, modules)
            if target is not None and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Each strongly connected component of more than one module (sorted), with one cycle through its first
    module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(start: str) -> None:  # iterative Tarjan: the graph is deep enough for recursion limits
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [(component, _cycle_through(component, graph)) for component in sorted(components)]


def _cycle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path first -> ... -> first inside the component (breadth first)."""
    members, first = set(component), component[0]
    paths = {first: [first]}
    queue = [first]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & members):
            if child == first:
                return [*paths[node], first]
            if child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    return component  # unreachable for a strongly connected component


def long_modules(modules: dict[str, Path], root: Path = ROOT) -> dict[str, int]:
    counts = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in modules.values()}
    return {path.relative_to(root).as_posix(): n for path, n in counts.items() if n > MAX_LINES}


def findings(root: Path = ROOT) -> dict[str, str]:
    """Every structure failure of the tree at `root`: key (`long: PATH`, `cycle: A <-> B`, `direction: A -> B`)
    -> explanation."""
    modules = source_files(root)
    graph = import_graph(modules)
    found: dict[str, str] = {}
    for path, n in long_modules(modules, root).items():
        found[f"long: {path}"] = f"{path} has {n} lines (limit {MAX_LINES}): split it along its concepts"
    for component, cycle in cycles(graph):
        found["cycle: " + " <-> ".join(component)] = "import cycle: " + " -> ".join(cycle)
    for module, path in modules.items():
        names = {f"{base}.{name}" if name else base for base, name in imports(module, path)}
        for prefix, forbidden in RULES:
            if module != prefix and not module.startswith(prefix + "."):
                continue
            for name in sorted(names):
                for bad in forbidden:
                    if name == bad or name.startswith(bad + "."):
                        owner = _owner(name, modules) or bad
                        target = owner if owner.startswith(bad) else bad
                        found[f"direction: {module} -> {target}"] = (
                            f"{module} imports {name} ({prefix} !-> {bad})"
                        )
    return found


def _report(keys: set[str], found: dict[str, str]) -> str:
    return "\n".join(f"  {key}: {found[key]}" for key in sorted(keys))


@pytest.fixture(scope="module")
def found() -> dict[str, str]:
    return findings()


def test_no_module_over_450_lines(found):
    new = {k for k in found if k.startswith("long: ")}
    assert not new, "modules over the limit:\n" + _report(new, found)


def test_no_import_cycles(found):
    new = {k for k in found if k.startswith("cycle: ")}
    assert not new, "import cycles (late and TYPE_CHECKING imports count):\n" + _report(new, found)


def test_dependencies_point_one_way(found):
    new = {k for k in found if k.startswith("direction: ")}
    assert not new, "dependencies running back:\n" + _report(new, found)


def test_the_checks_see_a_late_cycle_a_long_file_and_a_reverse_import(tmp_path):
    """The checks themselves: a tiny tree with one of each fault is reported with its modules."""
    for folder in LAYOUT:
        (tmp_path / folder).mkdir()
    (tmp_path / "sdk" / "__init__.py").write_text("")
    (tmp_path / "sdk" / "router").mkdir()
    (tmp_path / "sdk" / "router" / "__init__.py").write_text("")
    (tmp_path / "sdk" / "router" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from duetaspan.router.b import thing\n"
    )
    (tmp_path / "sdk" / "router" / "b.py").write_text(
        "def thing():\n    from . import c\n    from duetaspan.adapters.llm import ChatClient\n"
    )
    (tmp_path / "sdk" / "router" / "c.py").write_text("import duetaspan.router.a\n" + "x = 1\n" * MAX_LINES)
    (tmp_path / "adapters" / "__init__.py").write_text("")
    (tmp_path / "adapters" / "llm.py").write_text("class ChatClient: ...\n")
    found = findings(tmp_path)
    assert found["cycle: duetaspan.router.a <-> duetaspan.router.b <-> duetaspan.router.c"] == (
        "import cycle: duetaspan.router.a -> duetaspan.router.b -> duetaspan.router.c -> duetaspan.router.a"
    )
    assert "long: sdk/router/c.py" in found
    assert "direction: duetaspan.router.b -> duetaspan.adapters.llm" in found
    assert set(found) == {
        "cycle: duetaspan.router.a <-> duetaspan.router.b <-> duetaspan.router.c",
        "long: sdk/router/c.py",
        "direction: duetaspan.router.b -> duetaspan.adapters.llm",
    }
