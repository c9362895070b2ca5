"""tasks: what the retention pass pruned of a task's decision log, and when

The retention pass deletes the decisions (and the failed decisions' call records) of tasks
that ended more than the retention ago, while the task's totals (tokens, cost, decisions)
stay. Readers of the log (`amc decisions`, the console, the export) then showed nothing beside
totals nothing explained. The task's row now counts what went (`pruned_decisions`,
`pruned_failed_decisions`) and says when the last of it went (`pruned_at`).

Additive: two integer columns, 0 for every existing task (server default), and one nullable
timestamp; no index. Code from before it runs against the new schema (it never names the
columns). The downgrade drops them.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tasks",
        sa.Column("pruned_decisions", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column(
        "tasks",
        sa.Column("pruned_failed_decisions", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column("tasks", sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite 3.35+), as in 0019: a batch copy would lose 0015's expression
    # index on SQLite.
    op.drop_column("tasks", "pruned_at")
    op.drop_column("tasks", "pruned_failed_decisions")
    op.drop_column("tasks", "pruned_decisions")
