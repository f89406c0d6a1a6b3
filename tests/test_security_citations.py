"""SECURITY.md cites, for each defence, the test that fails without it: every cited test is where it says.

A citation is `path::name` (a file under tests/, or a bare file name such as `test_service.py` for the file of
that name under tests/), or `::name` for another test in the file cited last in the same row; `[case]`
parameters are ignored."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from tests.support import REPO_ROOT

CITATION = re.compile(r"`((?:[\w./-]+/)?test_\w+\.py)?::(\w+)")


@functools.cache
def _names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return frozenset(n.name for n in ast.walk(tree) if isinstance(n, kinds))


def _files(cited: str) -> list[Path]:
    if "/" in cited:
        return [REPO_ROOT / cited] if (REPO_ROOT / cited).is_file() else []
    return sorted((REPO_ROOT / "tests").rglob(cited))


def test_every_cited_test_exists_in_the_file_its_row_names():
    lines = (REPO_ROOT / "SECURITY.md").read_text(encoding="utf-8").splitlines()
    table = [line for line in lines if line.startswith("|")]
    wrong, seen = [], 0
    for row in table:
        current: str | None = None
        for match in CITATION.finditer(row):
            cited, name = match.group(1), match.group(2)
            current = cited or current
            seen += 1
            files = _files(current) if current else []
            if not any(name in _names(f) for f in files):
                wrong.append(f"{current}::{name}")
    assert seen > 50  # the table was read
    assert not wrong, f"SECURITY.md cites tests that are not where it says: {wrong}"
