"""The agent API's modules depend one way (issue 18): no import cycle among `duetaspan.agent.*`,
`duetaspan.config.*`, `serving`, `server` and `serve_cli`, counting late (in-function) and type-checking
imports too, and none of them over 450 lines."""

from __future__ import annotations

import ast
from pathlib import Path

SDK = Path(__file__).resolve().parent.parent / "sdk"
MODULES = {
    **{f"duetaspan.agent.{p.stem}": p for p in (SDK / "agent").glob("*.py")},
    **{f"duetaspan.config.{p.stem}": p for p in (SDK / "config").glob("*.py")},
    **{f"duetaspan.{name}": SDK / f"{name}.py" for name in ("serving", "server", "serve_cli")},
}


def _name(module: str) -> str:
    return module.removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Every `duetaspan...` module the file imports anywhere (top level, functions, `if TYPE_CHECKING`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    known = {_name(m) for m in MODULES}
    return {m for m in found if m in known}


def test_agent_config_and_serving_import_one_way() -> None:
    graph = {_name(m): _imports(p) for m, p in MODULES.items()}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycles.append([*path[path.index(nxt) :], nxt])
            else:
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert not cycles, f"import cycles: {cycles[:3]}"
    assert "duetaspan.agent" not in graph["duetaspan.serving"], "serving takes a ServedAgent, not the Agent"


def test_agent_api_modules_stay_small() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450}
    assert not long, f"split these modules (over 450 lines): {long}"
