"""A real PostgreSQL server for tests, started once per test session (per xdist worker) in a temporary folder
of its own: Unix socket only (no TCP port), fsync off, a fresh database per test.

Reusable: `from tests.store.pg import postgres_server, pg_url` in a conftest (tests/conftest.py does) gives
the fixtures `postgres_server` (session: the `PgServer`) and `pg_url` (a new empty database's URL). Skipped,
naming the package, where PostgreSQL (Debian `postgresql`) or psycopg (`pip install 'duetaspan[postgres]'`)
is missing.

`initdb` refuses root, so as root the cluster folder belongs to the `postgres` user and the server runs as
that user (runuser); as any other user it runs as that user.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SKIP_BINARIES = "PostgreSQL is not installed (Debian package postgresql: apt-get install postgresql)"
SKIP_DRIVER = "psycopg is not installed (pip install 'duetaspan[postgres]': psycopg, psycopg-pool)"


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PgServer:
    """One throwaway cluster: `start()`, `url(db)`, `create_database()`, `stop()`."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="duetaspan-pg-"))  # /tmp: reachable by the postgres user
        self.port = 5432  # the socket file is in our own folder: any port number is ours
        self.as_root = os.geteuid() == 0

    def _cmd(self, *args: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *args] if self.as_root else list(args)

    def start(self) -> None:
        os.chmod(self.root, 0o755)
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        data = self.root / "data"
        run = {"check": True, "capture_output": True, "timeout": 120}
        subprocess.run(
            self._cmd(
                str(self.bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
            ),
            **run,
        )  # type: ignore[call-overload]
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses='' -c fsync=off -c full_page_writes=off "
            "-c synchronous_commit=off -c max_connections=60"
        )
        subprocess.run(
            self._cmd(
                str(self.bindir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(self.root / "log"),
                "-w",
                "-t",
                "60",
                "start",
            ),
            **run,
        )  # type: ignore[call-overload]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.root}&port={self.port}"

    def create_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        subprocess.run(
            self._cmd(
                str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop"
            ),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PgServer]:
    """A PostgreSQL server for this session (worker); skipped where PostgreSQL or psycopg is missing."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        pytest.skip(SKIP_DRIVER)
    bindir = _bindir()
    if bindir is None:
        pytest.skip(SKIP_BINARIES)
    server = PgServer(bindir)
    try:
        server.start()
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(server.root, ignore_errors=True)
        pytest.fail(f"PostgreSQL did not start: {exc.stderr.decode(errors='replace')[-2000:]}")
    yield server
    server.stop()


@pytest.fixture
def pg_url(postgres_server: PgServer) -> str:
    """The URL of a new, empty database on the session's server."""
    return postgres_server.create_database()


__all__ = ["PgServer", "pg_url", "postgres_server"]
