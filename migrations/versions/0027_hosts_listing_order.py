"""hosts: on PostgreSQL, an index of host_id in ListHosts' order (COLLATE "C")

ListHosts pages by host id in code point order, which PostgreSQL gives as `host_id COLLATE
"C"`; the primary key's index follows the database's collation (en_US.UTF-8, C.UTF-8: not
"C" to the planner), so no index served that order and every page read the whole fleet and
sorted it to return fifty (EXPLAIN at 10,000 hosts: a Sort over a Seq Scan of 10,000 rows for
the first page and for a page deep in the walk). SQLite compares text by code point already
(BINARY) and its primary key's index serves the order: nothing to do there.

Additive: one index, PostgreSQL only; code from before it runs unchanged against the new
schema. The downgrade drops it. Both CONCURRENTLY (migrations/README.md): hosts' rows are
written by every hello, stop and disconnect of a running fleet. Not in the models (SQLite has
no "C" collation to declare it with): migrations/env.py leaves it out of `alembic check`, and
its test reads the catalogue.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from migrations import online

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_hosts_host_id_c"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    online.create_index(INDEX, 'hosts (host_id COLLATE "C")')


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    online.drop_index(INDEX)
