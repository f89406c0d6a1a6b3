"""The wheel a user gets: built from a copy of the tree (`pip wheel --no-deps --no-build-isolation`, the
dev extra's setuptools), it holds the browser page's static files, declares its license as an SPDX expression,
and setuptools warns neither about a deprecated license table nor about data folders missing from
`packages` (files it would drop in future setuptools)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from tests.support import REPO_ROOT

STATIC = REPO_ROOT / "adapters" / "webrtc" / "static"


def test_the_wheel_keeps_the_pages_files_and_builds_without_packaging_warnings(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    for folder in ("sdk", "tools", "adapters"):
        shutil.copytree(REPO_ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "absent from the `packages` configuration" not in log, log[-4000:]
    assert "project.license` as a TOML table is deprecated" not in log, log[-4000:]
    [wheel] = (tmp_path / "dist").glob("duetaspan-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = whl.read(metadata).decode()
    page = {f"duetaspan/adapters/webrtc/static/{p.name}" for p in STATIC.iterdir() if p.is_file()}
    assert {"duetaspan/adapters/webrtc/static/app.js", "duetaspan/adapters/webrtc/static/index.html"} <= page
    assert page <= names, sorted(page - names)
    assert "duetaspan/adapters/webrtc/service.py" in names and "duetaspan/tools/__init__.py" in names
    assert "License-Expression: Apache-2.0" in meta
