"""The PostgreSQL clusters of tests that stop and start their own (tests/support/
restartable_postgres.py) are copies of one cluster initdb made per test process: each still a
cluster of its own, on its own port and data folder, that nothing another test did is in."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.support import postgres
from tests.support import restartable_postgres as module
from tests.support.restartable_postgres import restartable_postgres

pytestmark = pytest.mark.postgres


def _databases(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database").fetchall()}


def test_two_clusters_run_initdb_at_most_once_and_share_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two clusters at once, the second made after the first has a database and restarted:
    initdb ran at most once for both (none if this process made its cluster already), the
    second has none of the first's databases, and a stop and start keeps each its own."""
    programs: list[str] = []
    real = postgres._run_as

    def run_as(user: str, args: list[str]) -> Any:
        programs.append(args[0].rsplit("/", 1)[-1])
        return real(user, args)

    # Every program the clusters start, whichever module starts it.
    monkeypatch.setattr(module, "_run_as", run_as)
    monkeypatch.setattr(postgres, "_run_as", run_as)
    with restartable_postgres() as first:
        made = first.server.create_database("amc_first")
        with restartable_postgres() as second:
            assert (first.port, first.data) != (second.port, second.data)
            admin = "host=127.0.0.1 user=amc dbname=postgres port={} password={}"
            first.restart()
            second.stop()
            second.start()
            ours = made.rsplit("/", 1)[1]
            assert ours in _databases(admin.format(first.port, first.password))
            assert ours not in _databases(admin.format(second.port, second.password))
    assert programs.count("initdb") <= 1, programs
    assert programs.count("cp") == 2, programs
