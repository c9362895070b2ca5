"""Session-wide fixtures and the test lanes.

A private PostgreSQL server is shared by every test that asks for one. Tests are marked by what
they need (postgres, browser, node: tests/support/lanes.py) so `make test-fast` can leave those
out; a test that needs one of them without its mark fails in every lane.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Generator, Iterator

import pytest

from tests.support import cpu_report, lanes, leaks, migrated, sqlalchemy_caches
from tests.support.postgres import PostgresServer, private_postgres


def pytest_configure(config: pytest.Config) -> None:
    lanes.install_guard()
    config.addinivalue_line(
        "markers",
        "empty_database: `db_url` stays empty even where the test's fixtures would migrate it "
        "(tests/cloud/conftest.py MIGRATING)",
    )
    leaks.install()
    cpu_report.register(config)


@pytest.fixture(autouse=True)
def nothing_left_running() -> Iterator[None]:
    """Fails a test that leaves a cloud replica or a host runner it started running (the
    session's shared replicas of tests/console and tests/abuse are meant to run on)."""
    before = leaks.running()
    yield
    left = [leaks.describe(s) for s in leaks.running() if s not in before]
    if left:
        pytest.fail(f"left running after the test (stop it, also when the test fails): {left}")


@pytest.fixture(autouse=True)
def disposed_dialects_freed() -> Iterator[None]:
    """After each test, SQLAlchemy's caches let go of the test's engine dialects
    (tests/support/sqlalchemy_caches.py): they held ~2,000 objects per cloud test."""
    yield
    sqlalchemy_caches.forget_dialects()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    lanes.mark_by_fixtures(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    lanes.watch(item)
    try:
        return (yield)
    finally:
        lanes.watch(None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    lanes.watch(item)
    try:
        return (yield)
    finally:
        lanes.watch(None)


@pytest.fixture(scope="session")
def postgres_session() -> Iterator[PostgresServer]:
    """A running PostgreSQL. Fails loudly if it cannot start, unless AMC_TEST_SKIP_POSTGRES=1."""
    if os.environ.get("AMC_TEST_SKIP_POSTGRES") == "1":
        pytest.skip("AMC_TEST_SKIP_POSTGRES=1")
    with private_postgres(autovacuum=False) as server:
        yield server


@pytest.fixture(scope="session")
def migrated_postgres(postgres_session: PostgresServer) -> str:
    """A PostgreSQL database migrated to head once per session (per xdist worker, each with its
    own server), made a template for `db_url` and the fault tests to copy
    (`create_database(template=...)`)."""
    url = postgres_session.create_database("amc_migrated")
    migrated.migrate(url)
    postgres_session.freeze_template(url)
    return url


@pytest.fixture
def postgres_server(request: pytest.FixtureRequest) -> PostgresServer:
    """The session's PostgreSQL, for a test marked `postgres` only: a test that reaches it by
    `request.getfixturevalue` (which collection cannot see) is refused, before the server starts,
    instead of slipping into the fast lane."""
    lanes.require(request.node, "postgres", "PostgreSQL")
    server: PostgresServer = request.getfixturevalue("postgres_session")
    return server


@pytest.fixture(scope="session", autouse=True)
def cloud_artifacts_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A cloud built without an artifact directory (PostgreSQL tests, say) keeps its step
    screenshots under the session's temporary folder, never in the working tree."""
    with pytest.MonkeyPatch.context() as patch:
        if "AMC_CLOUD_ARTIFACT_DIR" not in os.environ:
            patch.setenv("AMC_CLOUD_ARTIFACT_DIR", str(tmp_path_factory.mktemp("cloud-artifacts")))
        yield


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """The cycle collector off for the test: only reference counts free anything (a test of
    what a stopped server leaves in reference cycles). No collection first: garbage an earlier
    test left cannot hold what this test makes (nothing can reach it), and a full collection
    of a worker's grown heap cost 1.5-1.8 CPU-s per use."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
