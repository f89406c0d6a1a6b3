"""Every store test runs on both backends: `store_target` is a SQLite file in tmp_path or a fresh database on
the session's real PostgreSQL server (tests/store/pg.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["sqlite", "postgresql"])
def store_target(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "data" / "duetaspan.sqlite3")
    return request.getfixturevalue("pg_url")


@pytest.fixture
async def store(store_target):
    from duetaspan.store import open_store

    opened = await open_store(store_target, server_id="test-a")
    yield opened
    await opened.close()
