"""The PostgreSQL databases `create_database` makes ahead (tests/support/postgres.py): each test
still gets a private copy of its template, and nothing made ahead outlives the server's use."""

from __future__ import annotations

import psycopg
import pytest

from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.postgres


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _databases(server: PostgresServer) -> set[str]:
    with psycopg.connect(_dsn(server.url(server.admin_db))) as conn:
        rows = conn.execute("SELECT datname FROM pg_database").fetchall()
    return {row[0] for row in rows}


def test_each_call_gets_a_database_of_its_own_copied_from_its_template(
    postgres_server: PostgresServer,
) -> None:
    template = postgres_server.create_database("amc_ahead_template")
    with psycopg.connect(_dsn(template), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n integer)")
    postgres_server.freeze_template(template)
    first = postgres_server.create_database(template=template)
    second = postgres_server.create_database(template=template)
    third = postgres_server.create_database(template=template)
    assert len({first, second, third, template}) == 4
    with psycopg.connect(_dsn(first), autocommit=True) as conn:
        conn.execute("INSERT INTO kept VALUES (1)")
    for url in (second, third):
        with psycopg.connect(_dsn(url)) as conn:
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)


def test_close_drops_the_database_made_ahead(postgres_server: PostgresServer) -> None:
    # A server object of its own on the session's server: closing it leaves the session's be.
    own = PostgresServer(
        postgres_server.host, postgres_server.port, postgres_server.user, postgres_server.password
    )
    given = own.create_database()
    ahead = own._ahead[None].result()
    assert ahead.rsplit("/", 1)[1] in _databases(own)
    own.close()
    left = _databases(own)
    assert given.rsplit("/", 1)[1] in left
    assert ahead.rsplit("/", 1)[1] not in left
