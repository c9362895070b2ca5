"""flows: indexes in ListFlows' order (created_at, flow_id), unfiltered and by status

ListFlows pages newest first on (created_at, flow_id), filtered by status or not, yet the only
index of flows was (status, updated_at): every page read every flow of the listing's statuses
(all of them, unfiltered) and sorted them to return fifty, on both backends (SQLite: "SCAN
flows", "USE TEMP B-TREE FOR ORDER BY"; PostgreSQL: a Sort over a Seq Scan). The tasks'
listing has the same pair of indexes (ix_tasks_created_at_task_id, ix_tasks_status_created_at).

Additive: two indexes; code from before it runs unchanged against the new schema. The
downgrade drops them. On PostgreSQL both are built and dropped CONCURRENTLY (migrations/
README.md): the learning loop writes flows while a fleet upgrades.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from migrations import online

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


INDEXES = {
    "ix_flows_created_at_flow_id": ["created_at", "flow_id"],
    "ix_flows_status_created_at": ["status", "created_at", "flow_id"],
}


def upgrade() -> None:
    for name, columns in INDEXES.items():
        if op.get_bind().dialect.name == "postgresql":  # writes to flows go on meanwhile
            online.create_index(name, f"flows ({', '.join(columns)})")
        else:
            op.create_index(name, "flows", columns)


def downgrade() -> None:
    for name in reversed(INDEXES):
        if op.get_bind().dialect.name == "postgresql":
            online.drop_index(name)
        else:
            op.drop_index(name, table_name="flows")
