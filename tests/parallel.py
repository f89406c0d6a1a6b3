"""What the xdist workers of one test run share: artefacts built once per run under a file lock (the wheel).

Under pytest-xdist a session-scoped fixture runs once per worker, so an expensive artefact that tests only
read (a wheel of the repository) is built once per run in the run's shared temporary folder: the first
worker to ask builds it while holding `<name>.lock`, the others wait for the lock and find it done.

Use the fixtures of tests/conftest.py (`built_wheel`), or `once()` for a new artefact.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from tests.support import REPO_ROOT

WHEEL_SOURCES = ("sdk", "tools", "adapters", "setup.py", "pyproject.toml", "README.md")


def run_root(factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of the whole run: under xdist the parent of the workers' base folders."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """Folder `name` of this run, made by `build(folder)` exactly once across all workers; a build that
    raised leaves no folder, so the next asker tries again (and fails the same way, with its own error)."""
    root = run_root(factory)
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.write_text("ok")
    return folder


@dataclass(frozen=True)
class BuiltWheel:
    """The repository's wheel (`pip wheel --no-deps --no-build-isolation` of a copy of the package sources)
    and the build's full log."""

    path: Path
    log: str


def build_wheel(factory: pytest.TempPathFactory) -> BuiltWheel:
    """The run's one wheel of the repository, built from a copy of its sources (building writes egg-info
    and build/ into the source folder)."""

    def build(folder: Path) -> None:
        src, dist = folder / "src", folder / "dist"
        src.mkdir()
        for name in WHEEL_SOURCES:
            path = REPO_ROOT / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(path, src / name)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "VIRTUAL_ENV")}
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(dist),
             str(src)],
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
        (folder / "build.log").write_text(done.stdout + done.stderr)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    folder = once(factory, "wheel", build)
    [wheel] = (folder / "dist").glob("duetaspan-*.whl")
    return BuiltWheel(wheel, (folder / "build.log").read_text())
