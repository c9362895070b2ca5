"""The LISTEN connection's password never reaches a log line or an error a person reads.

`cloud.events` connects LISTEN with a libpq DSN rendered with the password in it (psycopg takes
no SQLAlchemy URL). A LISTEN that cannot connect is logged and retried every second for as long
as it lasts: each of those lines is written by the handler every process writes through, and
says only the failure's kind (`cloud.store.errors.report`). Real psycopg, a real refused
connection and a real server refusing the password; no mocks.
"""

from __future__ import annotations

import asyncio
import io
import logging

import pytest
from sqlalchemy.engine import make_url

from cloud.events import EventBus
from cloud.store.database import Store
from telemetry import logs
from tests.support.postgres import PostgresServer
from tests.support.processes import free_port
from tests.support.waiting import until

PASSWORD = "pw-LISTEN-s3cret-9f2c"


async def _listen_logged(url: str) -> str:
    """What the log says while the bus at `url` fails to LISTEN (a few tries)."""
    buffer = io.StringIO()
    handler = logs.handler("text", buffer)
    root = logging.getLogger()
    root.addHandler(handler)
    store = Store.from_url(url)
    bus = EventBus(store)
    try:
        starting = asyncio.ensure_future(bus.start())
        await until(
            lambda: buffer.getvalue().count("LISTEN connection lost") >= 2,
            15,
            "two failed LISTEN tries logged",
        )
        await starting
    finally:
        await bus.stop()
        await store.close()
        root.removeHandler(handler)
    return buffer.getvalue()


@pytest.mark.postgres
async def test_a_refused_listen_connection_logs_no_password() -> None:
    logged = await _listen_logged(
        f"postgresql+psycopg://amc:{PASSWORD}@127.0.0.1:{free_port()}/amc"
    )
    assert "LISTEN connection lost" in logged
    assert PASSWORD not in logged, logged


@pytest.mark.postgres
async def test_a_listen_connection_refused_its_role_logs_no_password(
    postgres_server: PostgresServer,
) -> None:
    """The server refuses the role (none of that name): the failure comes from the server."""
    url = make_url(postgres_server.create_database()).set(username="nobody_here", password=PASSWORD)
    logged = await _listen_logged(url.render_as_string(hide_password=False))
    assert "LISTEN connection lost" in logged
    assert PASSWORD not in logged, logged
