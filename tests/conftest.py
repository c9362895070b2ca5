"""Session-wide fixtures: a private PostgreSQL server (shared by every test that asks for one)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.postgres import PostgresServer, private_postgres


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A running PostgreSQL. Fails loudly if it cannot start, unless AMC_TEST_SKIP_POSTGRES=1."""
    if os.environ.get("AMC_TEST_SKIP_POSTGRES") == "1":
        pytest.skip("AMC_TEST_SKIP_POSTGRES=1")
    with private_postgres() as server:
        yield server
