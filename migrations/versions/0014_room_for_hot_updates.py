"""attempts, tasks: leave a fifth of each page free, so renewals update rows in place (PostgreSQL)

A renewal that is written changes its attempt's progress and counters and its task's
`updated_at`; far from expiry it keeps the lease's expiry (`cloud.store.leases.write_renewals`),
so none of the attempt's indexed columns change. PostgreSQL can then write the new row version
on the same page without touching any index (a HOT update), but only if the page has room:
at the default fillfactor (100) pages are packed full by the inserts, and the fleet's first
renewals (every one written: it starts its attempt) each put a new entry in all five of the
attempt's indexes and the task's five. With `fillfactor = 80` new pages keep a fifth free.

PostgreSQL only: SQLite writes rows in place and has no such setting, so there this migration
changes nothing. It applies to pages written from now on (existing pages are repacked only by
VACUUM FULL or CLUSTER, which an operator may run at a quiet moment). The downgrade resets
both tables to the default.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("attempts", "tasks")
FILLFACTOR = 80


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in _TABLES:
        op.execute(f"ALTER TABLE {table} SET (fillfactor = {FILLFACTOR})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in _TABLES:
        op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
