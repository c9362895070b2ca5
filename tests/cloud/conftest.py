"""Fixtures for cloud tests: certificates, one database per test on each backend, a server."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cloud import pki
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from cloud.store.database import Store
from cloud.store.engine import upgrade
from tests.cloud.cloud_harness import channel, tasks_stub
from tests.support import migrated
from tests.support.fakes import FakeModelServer
from tests.support.postgres import PostgresServer

HOST_IDS = [f"h{i}" for i in range(30)] + ["a", "b"]


@pytest.fixture(scope="session")
def pki_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    pki.init_ca(directory)
    pki.write_server_cert(directory)
    for host_id in HOST_IDS:
        pki.write_host_cert(directory, host_id)
    pki.write_operator_cert(directory, "ops")
    pki.write_viewer_cert(directory, "watcher")
    return directory


#: Fixtures that migrate their database to head before the test sees it: a test using one gets
#: its database already migrated, copied from the session's migrated one (`db_url`).
#: `make_settings` is one: its settings leave `migrate_on_start` on, so a server built from them
#: migrates at start, and every server fixture here builds from it. A test that wants its
#: database empty or at an older revision with `make_settings` (a start against an old schema,
#: say) is marked `empty_database`; one that migrates `db_url` itself (a migration's round
#: trip) without these fixtures gets it empty anyway.
MIGRATING = {"store", "make_settings"}


@pytest.fixture(scope="session")
def migrated_sqlite() -> Path:
    """A SQLite database migrated to head once per session (per xdist worker), for `db_url` to
    copy: the one the fault and node tests' cloud processes start from too."""
    return migrated.migrated_sqlite()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database on each backend: empty, or, for a test that migrates it to head anyway
    (through one of `MIGRATING`), a copy of one migrated once per session. Migrating took most
    of such a test's setup (25 migrations, each a transaction, under a loaded machine)."""
    empty = request.node.get_closest_marker("empty_database") is not None
    at_head = not empty and not MIGRATING.isdisjoint(request.fixturenames)
    if request.param == "sqlite":
        path = tmp_path / "cloud.sqlite3"
        if at_head:
            shutil.copyfile(request.getfixturevalue("migrated_sqlite"), path)
        yield f"sqlite+aiosqlite:///{path}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    template = request.getfixturevalue("migrated_postgres") if at_head else None
    # Not dropped afterwards: DROP DATABASE can stall on backends still winding down, and the
    # whole throwaway cluster is deleted at the end of the session anyway.
    yield server.create_database(template=template)


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    """A migrated store on a fresh database of each backend."""
    s = Store.from_url(db_url)
    await upgrade(s.engine)
    try:
        yield s
    finally:
        await s.close()


SettingsFactory = Callable[..., CloudSettings]


@pytest.fixture
def make_settings(db_url: str, pki_dir: Path) -> SettingsFactory:
    """Settings for a test replica: port 0, mTLS and fast background jobs.

    The default lease is long: a loaded CI machine stalls for seconds, and a test whose task
    held a lease of a second or two saw it run out in steps that were not about leases. A test
    that needs a lease to end asks for a short one (`lease_duration`) or ends it (`lapse`).
    """

    def make(**overrides: Any) -> CloudSettings:
        values: dict[str, Any] = {
            "database_url": db_url,
            "listen_address": "127.0.0.1:0",
            "pki_dir": pki_dir,
            "default_lease_seconds": 60.0,
            "min_lease_seconds": 0.2,
            "sweep_interval_seconds": 0.1,
            "dispatch_interval_seconds": 0.5,
            "host_heartbeat_seconds": 1.0,
            "shutdown_grace_seconds": 0.5,
        }
        values.update(overrides)
        return CloudSettings(**values)

    return make


@pytest.fixture
async def cloud(make_settings: SettingsFactory) -> AsyncIterator[CloudServer]:
    server = await build_server(make_settings())
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0.5)


@pytest.fixture
async def offline_cloud(
    make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[CloudServer]:
    """A cloud planning with the offline provider (no model), in compact mode: Decide answers
    without a provider, so a test of the contract around it needs no fake server."""
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "offline")
    monkeypatch.delenv("AMC_PLANNER_MODE", raising=False)
    server = await build_server(make_settings())
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0.5)


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    """The fake model provider (Anthropic and OpenAI wire formats) on a loopback port."""
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def anthropic_env() -> dict[str, str]:
    """Planner settings a test file adds to `anthropic_cloud`'s (override to add some)."""
    return {}


@pytest.fixture
async def anthropic_cloud(
    make_settings: SettingsFactory,
    model: FakeModelServer,
    anthropic_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[CloudServer]:
    """A cloud planning with the real Anthropic SDK against `model`, without SDK retries."""
    for name, value in {
        "AMC_PLANNER_PROVIDER": "anthropic",
        "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
        "AMC_PLANNER_ANTHROPIC_API_KEY": "sk-ant-test",
        "AMC_PLANNER_ANTHROPIC_BASE_URL": model.anthropic_base_url,
        "AMC_PLANNER_MAX_RETRIES": "0",
        **anthropic_env,
    }.items():
        monkeypatch.setenv(name, value)
    server = await build_server(make_settings(default_lease_seconds=30))
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0.5)


@pytest.fixture
async def ops(cloud: CloudServer, pki_dir: Path) -> AsyncIterator[Any]:
    """TaskService stub with the operator certificate."""
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        yield tasks_stub(ch)
    finally:
        await ch.close()
