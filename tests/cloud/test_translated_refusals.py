"""A PostgreSQL server out of connections is named whatever language it speaks, and the
SQLSTATEs an operator can act on are named from psycopg's exception.

libpq gives a connection refused at the server's limit no SQLSTATE (psycopg's `sqlstate`,
`diag` and `pgresult` are all empty: checked below), so the cloud told it by the server's
English words only; a server whose messages were German was logged as a bare
"OperationalError". This machine has no German locale generated, so the server is given German
messages through gettext's `LANGUAGE` (its `lc_messages` is C.UTF-8, which gettext translates
through; the catalogues ship with Debian's server). The SQLSTATE path is proven with a real
server raising each code (`RAISE ... USING ERRCODE`), since no refused connection carries one.
"""

from __future__ import annotations

import importlib.util
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

import cloud.store.pg_refusals
from cloud.store import errors
from cloud.store.database import Store
from tests.support.postgres import _binary, _run_as, _wait_ready
from tests.support.restartable_postgres import RestartablePostgres

pytestmark = pytest.mark.postgres

NAMED = "the database server has no connection left for this replica"
ROOT = Path(__file__).resolve().parents[2]


class GermanPostgres(RestartablePostgres):
    """A private cluster that speaks German and takes `max_connections` connections."""

    max_connections = 3

    def _pg_ctl(self, *args: str) -> None:
        options = (
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1"
            f" -c max_connections={self.max_connections} -c superuser_reserved_connections=0"
            " -c lc_messages=C.UTF-8"
        )
        _run_as(
            self.os_user,
            [
                "env",
                "LANGUAGE=de",
                _binary("pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.base / "server.log"),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                *args,
            ],
        )
        _wait_ready(self.server)


@pytest.fixture
def german() -> Iterator[GermanPostgres]:
    if not any(Path("/usr/share/locale/de/LC_MESSAGES").glob("postgres-*.mo")):
        pytest.skip("no German catalogue of the PostgreSQL server installed")
    pg = GermanPostgres()
    try:
        pg.init()
        pg.start()
        yield pg
    finally:
        pg.remove()


def _dsn(pg: GermanPostgres, user: str = "amc", password: str | None = None) -> str:
    return (
        f"host=127.0.0.1 port={pg.port} user={user} password={password or pg.password}"
        " dbname=postgres"
    )


def test_a_german_server_out_of_connections_is_named(german: GermanPostgres) -> None:
    # Connections until the server refuses one: at most one more than it takes, though under
    # load the backend of the fixture's readiness check may still count for a moment (then
    # the refusal comes one earlier: it is the refusal this test reads, not where it comes).
    held: list[psycopg.Connection] = []

    def connect_until_refused() -> None:
        for _ in range(german.max_connections + 1):
            held.append(psycopg.connect(_dsn(german)))

    try:
        with pytest.raises(psycopg.OperationalError) as refused:
            connect_until_refused()
    finally:
        for conn in held:
            conn.close()
    said = str(refused.value)
    assert "zu viele Verbindungen" in said, said  # the server spoke German
    assert (refused.value.sqlstate, refused.value.diag.sqlstate) == (None, None)
    assert refused.value.pgresult is None  # nothing else to read a code from
    assert errors.cause(refused.value) == errors._NO_CONNECTION_LEFT


async def test_a_german_role_limit_is_named_in_the_replicas_log(
    german: GermanPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"amc_limited_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_dsn(german), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' CONNECTION LIMIT 0")
    store = Store.from_url(f"postgresql+psycopg://{role}:pw@127.0.0.1:{german.port}/postgres")
    try:
        with pytest.raises(DBAPIError) as refused:
            async with store.read() as session:
                await session.execute(text("SELECT 1"))
    finally:
        await store.close()
    assert "zu viele Verbindungen von Rolle" in str(refused.value.orig), refused.value
    with caplog.at_level(logging.WARNING):
        errors.report(logging.getLogger("test"), "renewal batch failed", refused.value)
    line = caplog.records[-1].getMessage()
    assert f"database unavailable: OperationalError (psycopg.OperationalError): {NAMED}" in line
    assert role not in line and "Rolle" not in line, line  # no server text


@pytest.mark.parametrize(
    ("state", "named"),
    [
        ("53300", NAMED),
        ("53400", "a limit of the database server's configuration was reached"),
        ("57P03", "the database server is starting up, shutting down or recovering"),
    ],
)
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_sqlstate_an_operator_can_act_on_is_named(
    store: Store, state: str, named: str
) -> None:
    with pytest.raises(DBAPIError) as raised:
        async with store.read() as session:
            await session.execute(
                text(f"DO $$ BEGIN RAISE EXCEPTION 'any words' USING ERRCODE = '{state}'; END $$")
            )
    said = errors.describe(raised.value)
    assert f"SQLSTATE {state}" in said and named in said, said
    assert "any words" not in said


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "pg_refusal_words", ROOT / "scripts/pg_refusal_words.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_translated_words_are_the_installed_servers() -> None:
    """`pg_refusals` is what the script makes from the catalogues installed with the server, so
    a newer server's translations are one run of it away."""
    script = _script()
    table = script.catalogues()
    if not table:
        pytest.skip("no PostgreSQL message catalogues installed")
    assert script.render(table) == Path(cloud.store.pg_refusals.__file__).read_text()
    assert "tut mir leid, schon zu viele Verbindungen" in cloud.store.pg_refusals.TRANSLATED["de"]
