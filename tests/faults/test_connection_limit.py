"""PostgreSQL out of connections for a replica (max_connections, a role's CONNECTION LIMIT).

Real `amc cloud serve` and a real Store on the session's PostgreSQL, through a role of its own
whose connection limit is reached. libpq reports that refusal with no SQLSTATE, so the cloud
named nothing: a replica started into it exited 2 with the hint "check that it is reachable and
the credentials are right" (it was reachable, the credentials right), and a running replica's
log said only "database unavailable: OperationalError (psycopg.OperationalError)" for as long
as it lasted. Proves: both name the limit and what to change, without the server's text.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from cloud.store import errors
from cloud.store.database import Store
from tests.support.postgres import PostgresServer
from tests.support.processes import refused_start

pytestmark = pytest.mark.postgres

NAMED = "the database server has no connection left for this replica"


@contextlib.contextmanager
def _limited_role(server: PostgresServer, database_url: str, limit: int) -> Iterator[str]:
    """The URL of `database_url` through a new role (not a superuser: a superuser is exempt
    from connection limits) that may hold `limit` connections at once."""
    role = f"amc_limited_{uuid.uuid4().hex[:8]}"
    admin = server.url(server.admin_db).replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' CONNECTION LIMIT {limit}")
    try:
        yield database_url.replace(f"{server.user}:{server.password}@", f"{role}:pw@")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            conn.execute(f"DROP ROLE {role}")


def test_a_replica_started_with_no_connection_left_says_so(
    tmp_path: Path, fault_pki: Path, postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    url = postgres_server.create_database(template=migrated_postgres)
    with _limited_role(postgres_server, url, 0) as limited:
        said = refused_start(tmp_path, fault_pki, limited)
    assert "cannot open the database postgresql+psycopg://amc_limited_" in said, said
    assert NAMED in said and "raise the limit" in said, said
    assert "credentials are right" not in said, said


async def test_a_running_replica_logs_the_limit_by_name(
    postgres_server: PostgresServer, migrated_postgres: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = postgres_server.create_database(template=migrated_postgres)
    with _limited_role(postgres_server, url, 1) as limited:
        held = psycopg.connect(limited.replace("postgresql+psycopg://", "postgresql://"))
        store = Store.from_url(limited)
        try:
            with pytest.raises(OperationalError) as refused:
                async with store.read() as session:
                    await session.execute(text("SELECT 1"))
        finally:
            await store.close()
            held.close()
    assert errors.unavailable(refused.value)  # a client is told UNAVAILABLE, retry
    with caplog.at_level(logging.WARNING):
        errors.report(logging.getLogger("test"), "renewal batch failed", refused.value)
    line = caplog.records[-1].getMessage()
    assert f"database unavailable: OperationalError (psycopg.OperationalError): {NAMED}" in line
    assert "amc_limited_" not in line and "127.0.0.1" not in line, line  # no server text
