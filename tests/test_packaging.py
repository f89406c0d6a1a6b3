"""The wheel a user gets: built from a copy of the tree (`pip wheel --no-deps --no-build-isolation`, the
dev extra's setuptools; built once per run for all tests that read it, the `built_wheel` fixture), it holds
the browser page's static files, declares its license as an SPDX expression, and setuptools warns neither about
a deprecated license table nor about data folders missing from `packages` (files it would drop in future
setuptools)."""

from __future__ import annotations

import zipfile

from tests.support import REPO_ROOT

STATIC = REPO_ROOT / "adapters" / "webrtc" / "static"


def test_the_wheel_keeps_the_pages_files_and_builds_without_packaging_warnings(built_wheel):
    log, wheel = built_wheel.log, built_wheel.path
    assert "absent from the `packages` configuration" not in log, log[-4000:]
    assert "project.license` as a TOML table is deprecated" not in log, log[-4000:]
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = whl.read(metadata).decode()
    page = {f"duetaspan/adapters/webrtc/static/{p.name}" for p in STATIC.iterdir() if p.is_file()}
    assert {"duetaspan/adapters/webrtc/static/app.js", "duetaspan/adapters/webrtc/static/index.html"} <= page
    assert page <= names, sorted(page - names)
    assert "duetaspan/adapters/webrtc/service.py" in names and "duetaspan/tools/__init__.py" in names
    assert "License-Expression: Apache-2.0" in meta
