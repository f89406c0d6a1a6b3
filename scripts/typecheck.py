"""Type-checks the packages listed in pyproject's `[tool.mypy] packages` (scripts/test.sh runs it).

The import package is assembled from folders (setup.py's LAYOUT: `sdk/` is `duetaspan`, `tools/` is
`duetaspan.tools`, `adapters/` is `duetaspan.adapters`), and no type checker can map a folder onto another
package name. The editable install resolves it with an import hook, which type checkers don't run. So this
script lays the package out under `build/typecheck/duetaspan/` as symlinks into the real folders (pyproject's
`mypy_path` and pyright's `extraPaths` point there), runs mypy, and prints each error with the path of the
real source file.

    python scripts/typecheck.py                 # the packages pyproject lists
    python scripts/typecheck.py -p duetaspan.model   # any other mypy arguments instead
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TREE = REPO_ROOT / "build" / "typecheck"


def layout() -> dict[str, str]:
    """setup.py's LAYOUT, read without running setup.py, so the mapping lives in one place."""
    module = ast.parse((REPO_ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in module.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "LAYOUT" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, dict):
                return {str(k): str(v) for k, v in value.items()}
    raise SystemExit("setup.py has no LAYOUT = {...} mapping package names to folders")


def build_tree(mapping: dict[str, str]) -> dict[Path, Path]:
    """Lays out build/typecheck/<package path> with one symlink per entry of each mapped folder; returns
    {link folder: real folder} so that reported paths can be mapped back. Rebuilt on every run (cheap), so
    new files and folders are always seen."""
    shutil.rmtree(TREE, ignore_errors=True)
    folders: dict[Path, Path] = {}
    for name, folder in mapping.items():
        target = TREE.joinpath(*name.split("."))
        target.mkdir(parents=True, exist_ok=True)
        source = REPO_ROOT / folder
        for entry in sorted(source.iterdir()):
            if entry.name == "__pycache__" or entry.name in _nested(name, mapping):
                continue
            (target / entry.name).symlink_to(entry)
        folders[target] = source
    return folders


def _nested(name: str, mapping: dict[str, str]) -> set[str]:
    """Names of packages mapped from other folders that sit directly inside `name` (tools, adapters)."""
    return {other.rsplit(".", 1)[1] for other in mapping if other.rpartition(".")[0] == name}


def real_path(line: str, folders: dict[Path, Path]) -> str:
    """Rewrites a build/typecheck/... path at the start of a mypy output line to the real source path."""
    # the deepest link folder first, so duetaspan/tools/ maps to tools/, not sdk/tools/
    for link, source in sorted(folders.items(), key=lambda item: -len(item[0].parts)):
        prefix = os.path.relpath(link, REPO_ROOT) + os.sep
        if line.startswith(prefix):
            return os.path.relpath(source, REPO_ROOT) + os.sep + line[len(prefix) :]
    return line


def main(argv: list[str]) -> int:
    folders = build_tree(layout())
    command = [sys.executable, "-m", "mypy", "--config-file", str(REPO_ROOT / "pyproject.toml"), *argv]
    proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        print(real_path(line, folders))
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
