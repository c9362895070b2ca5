"""A replica's PostgreSQL pool has a ceiling the operator sets (AMC_CLOUD_DATABASE_POOL_SIZE).

Every replica's pool counts against the server's max_connections (100 by default), and the
pool was fixed at 10 kept + 20 more (with `OWN_CONNECTIONS` besides): three busy replicas were
99, and nothing could be turned down. Now the ceiling is a setting with the old default, refused
below what the cloud's own jobs need (naming that minimum), and the start banner says it. The
engine is made without connecting, so no server is needed.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cloud.server import build_server
from cloud.settings import CloudSettings
from cloud.startup import explain
from cloud.store.pool import DEFAULT_POOL_SIZE, MIN_POOL_SIZE, OWN_CONNECTIONS

UNREACHABLE = "postgresql+psycopg://amc:pw@127.0.0.1:1/amc"


def _settings(pool_size: int) -> CloudSettings:
    return CloudSettings(
        database_url=UNREACHABLE,
        listen_address="127.0.0.1:0",
        insecure=True,
        database_pool_size=pool_size,
    )


@pytest.mark.parametrize(("size", "kept", "more"), [(None, 10, 20), (7, 2, 5), (60, 20, 40)])
async def test_the_pool_opens_at_most_the_set_number_of_connections(
    monkeypatch: pytest.MonkeyPatch, size: int | None, kept: int, more: int
) -> None:
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "offline")
    if size is not None:
        monkeypatch.setenv("AMC_CLOUD_DATABASE_POOL_SIZE", str(size))
    settings = CloudSettings(database_url=UNREACHABLE, listen_address="127.0.0.1:0", insecure=True)
    assert settings.database_pool_size == (size or DEFAULT_POOL_SIZE)
    server = await build_server(settings)
    try:
        pool = server.store.engine.pool
        assert (pool.size(), pool._max_overflow) == (kept, more)  # type: ignore[attr-defined]
        banner = "\n".join(server.describe())
    finally:
        await server.stop(0)
    assert (
        f"up to {kept + more} pooled connections + {OWN_CONNECTIONS} of its own,"
        " AMC_CLOUD_DATABASE_POOL_SIZE" in banner
    ), banner


def test_a_pool_below_the_minimum_is_refused_naming_it() -> None:
    with pytest.raises(ValidationError) as refused:
        _settings(MIN_POOL_SIZE - 1)
    line = explain(refused.value)
    assert line is not None
    assert line.startswith(f"AMC_CLOUD_DATABASE_POOL_SIZE: must be at least {MIN_POOL_SIZE}:"), line
    assert _settings(MIN_POOL_SIZE).database_pool_size == MIN_POOL_SIZE
