"""The campaign tests run on both stores, like tests/store (a SQLite file, a fresh PostgreSQL database)."""

from tests.store.conftest import store, store_target  # noqa: F401
