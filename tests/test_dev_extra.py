"""`pip install -e '.[dev]' && pytest` collects cleanly: every third-party package the suite imports (tests/,
examples/) is installed by the package's dependencies or its `dev` extra, unless the importing test skips
without it (`pytest.importorskip`). Checked against the installed metadata: each imported top-level module
must belong to a distribution in the dependency closure of pyproject's dependencies and `dev` extra."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions, requires
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
# our own modules: the package, the suite, the examples, and the benchmark scripts tests import from
# benchmarks/ (put on sys.path by the test: `from asr import wer`)
OURS = {"duetaspan", "tests", "examples", *(p.stem for p in (REPO / "benchmarks").glob("*.py"))}


def _closure() -> set[str]:
    """Distribution names (normalised) that pyproject's dependencies and `dev` extra install, transitively
    (through the installed packages' metadata)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo: list[tuple[str, set[str]]] = []
    for line in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():
            todo.append((req.name, set(req.extras)))
    while todo:
        name, wanted = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if (key, tuple(sorted(wanted))) in seen:
            continue
        seen.add((key, tuple(sorted(wanted))))
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        for line in reqs:
            req = Requirement(line)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, set(req.extras)))
    return {key for key, _ in seen}


def _suite_imports() -> dict[str, str]:
    """Third-party module (as imported) -> a file importing it, over tests/ and examples/."""
    found: dict[str, str] = {}
    for path in sorted([*REPO.joinpath("tests").rglob("*.py"), *REPO.joinpath("examples").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OURS:
                    found.setdefault(name, str(path.relative_to(REPO)))
    return found


def _skipped_without() -> set[str]:
    text = "\n".join(p.read_text(encoding="utf-8") for p in REPO.joinpath("tests").rglob("*.py"))
    return {m.split(".")[0] for m in re.findall(r"importorskip\(\s*[\"']([\w.]+)", text)}


def _owners(module: str, by_top: dict[str, list[str]]) -> set[str]:
    """The distributions that provide `module`: by its top-level name, or (a namespace package shared by
    several, like `opentelemetry`) the one whose files hold the module."""
    candidates = by_top.get(module.split(".")[0], [])
    if len(candidates) > 1:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        for name in candidates:
            files = distribution(name).files or []
            if origin is not None and any(
                Path(distribution(name).locate_file(f)).resolve() == origin for f in files
            ):
                return {re.sub(r"[-_.]+", "-", name).lower()}
        if origin is None:
            return set()
    return {re.sub(r"[-_.]+", "-", d).lower() for d in candidates}


def test_the_dev_extra_installs_what_the_suite_imports():
    installed = _closure()
    owners = packages_distributions()
    missing = []
    for module, where in sorted(_suite_imports().items()):
        if module.split(".")[0] in _skipped_without():
            continue
        dists = _owners(module, owners)
        if not dists & installed:
            missing.append(f"{module} (imported by {where}; from {sorted(dists) or 'nothing installed'})")
    assert not missing, "the suite imports what `pip install -e '.[dev]'` does not install:\n" + "\n".join(
        missing
    )
