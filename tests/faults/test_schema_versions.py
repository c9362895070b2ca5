"""`amc cloud serve` started on a PostgreSQL database another release's migrations left.

Real `amc cloud serve` processes on the session's PostgreSQL. Proves: a database a newer release
migrated (its revision unknown to this code) is served with one warning naming both migrations
(migrations are additive: an older replica must come back during a rolling deploy or after a
rollback); with AMC_CLOUD_MIGRATE_ON_START=false, one still at an older migration is refused
before the replica serves: exit 2 and one line naming the setting, both migrations and what to
run (before, it was served and its calls failed on the columns and tables the missing
migrations add).
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from alembic.script import ScriptDirectory

from cloud.store.database import Store
from cloud.store.engine import alembic_config, downgrade
from tests.support.postgres import PostgresServer
from tests.support.processes import cloud_process, free_port, refused_start, wait_serving

pytestmark = pytest.mark.postgres

#: This code's newest migration, and the one before it (read from the scripts: a new migration
#: must not make these tests fail).
_HEAD_SCRIPT = ScriptDirectory.from_config(alembic_config()).get_revision("head")
assert _HEAD_SCRIPT is not None and isinstance(_HEAD_SCRIPT.down_revision, str)
HEAD = _HEAD_SCRIPT.revision
BEFORE_HEAD = _HEAD_SCRIPT.down_revision


def _refusal(tmp_path: Path, fault_pki: Path, url: str, extra: dict[str, str]) -> str:
    said = refused_start(tmp_path, fault_pki, url, extra)
    assert "alembic.runtime" not in said, said  # its lines only at DEBUG (engine._quiet_steps)
    return said


@pytest.mark.parametrize("migrate", ["true", "false"])
async def test_a_database_a_newer_release_migrated_is_served_with_a_warning(
    tmp_path: Path,
    fault_pki: Path,
    postgres_server: PostgresServer,
    migrated_postgres: str,
    migrate: str,
) -> None:
    """An older replica restarted during a rolling deploy, or after a rollback, finds the
    database a newer release migrated (a revision this code does not know). Migrations are
    additive, so it serves on it, saying so once; refused (exit 2), it stayed down until the
    database was downgraded, and before that it ended "unexpected CommandError"."""
    url = postgres_server.create_database(template=migrated_postgres)
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999_of_a_newer_release'")
    port = free_port()
    cloud = cloud_process(
        tmp_path,
        "cloud",
        database_url=url,
        pki_dir=fault_pki,
        port=port,
        extra={"AMC_CLOUD_MIGRATE_ON_START": migrate},
    ).start()
    try:
        await wait_serving(f"127.0.0.1:{port}", fault_pki)
    finally:
        cloud.stop()
    said = cloud.output()
    assert (
        "the database is at migration 9999_of_a_newer_release, newer than this amc's newest,"
        f" {HEAD}: a newer release migrated it; serving on it (migrations are additive)" in said
    ), said
    assert "unexpected" not in said and "Traceback" not in said, said
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        (version,) = conn.execute("SELECT version_num FROM alembic_version").fetchone() or ("",)
    assert version == "9999_of_a_newer_release"  # nothing migrated "down" or "up"


async def test_a_database_behind_with_migrations_off_is_refused_not_served(
    tmp_path: Path, fault_pki: Path, postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    url = postgres_server.create_database(template=migrated_postgres)
    store = Store.from_url(url)
    try:
        await downgrade(store.engine, BEFORE_HEAD)
    finally:
        await store.close()
    said = _refusal(tmp_path, fault_pki, url, {"AMC_CLOUD_MIGRATE_ON_START": "false"})
    assert (
        f"AMC_CLOUD_DATABASE_URL: the database is at migration {BEFORE_HEAD}, older than this"
        f" amc's newest, {HEAD}; upgrade it first" in said
    ), said
