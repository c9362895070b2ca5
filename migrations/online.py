"""Index builds that leave a running fleet's writes alone on PostgreSQL (migrations/README.md).

A plain CREATE INDEX holds a SHARE lock on its table until it is built: every INSERT, UPDATE
and DELETE of the table waits meanwhile, and, queued behind it, so does every later one, while
it waits for a long transaction to end first. CONCURRENTLY takes SHARE UPDATE EXCLUSIVE, which
writes do not wait for; it cannot run in a transaction, so it runs in Alembic's autocommit
block (the migration's transaction is committed before it: env.py gives each file its own).
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import text


def create_index(name: str, on: str) -> None:
    """CREATE INDEX CONCURRENTLY `name` ON `on` (e.g. `hosts (host_id)`), PostgreSQL only.
    A build that failed (a cancel, a lost connection) leaves the index behind INVALID, so it
    is dropped first and built again; one already valid is kept (a file run again after its
    build committed but before its revision was stamped)."""
    with op.get_context().autocommit_block():
        invalid = (
            op.get_bind()
            .execute(
                text("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"),
                {"name": name},
            )
            .scalar()
        )
        if invalid:
            op.execute(f"DROP INDEX CONCURRENTLY {name}")
        op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {on}")


def drop_index(name: str) -> None:
    """DROP INDEX CONCURRENTLY `name` (if it is there), PostgreSQL only: a plain DROP INDEX
    takes an ACCESS EXCLUSIVE lock on the table, which even its reads wait for."""
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
