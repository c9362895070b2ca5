"""lease history and task totals: lease_events, renewal summary, who cancelled, token totals

Additive: a new `lease_events` table (one row per assignment, resumption, revocation, expiry,
cancel, result, requeue), three renewal-summary columns on `attempts`, and on `tasks` the
cancelling operator plus token totals summed from the decision log (filled for existing tasks
here, so totals survive the log's pruning from now on). The downgrade drops all of it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: tasks column -> the decisions column it sums.
_TOTALS = {
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "cache_read_tokens": "cache_read_input_tokens",
    "cache_write_tokens": "cache_creation_input_tokens",
    "thinking_tokens": "thinking_tokens",
}


def upgrade() -> None:
    op.create_table(
        "lease_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=24), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("host_id", sa.String(length=128), nullable=True),
        sa.Column("device_serial", sa.String(length=128), nullable=True),
        sa.Column("operator", sa.String(length=256), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("result_status", sa.String(length=16), nullable=True),
        sa.Column("task_status", sa.String(length=16), nullable=True),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.task_id"],
            name=op.f("fk_lease_events_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lease_events")),
    )
    with op.batch_alter_table("lease_events") as batch:
        batch.create_index("ix_lease_events_task_id_id", ["task_id", "id"], unique=False)
    op.add_column(
        "attempts", sa.Column("renewals", sa.Integer(), server_default="0", nullable=False)
    )
    op.add_column(
        "attempts", sa.Column("first_renewed_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "attempts", sa.Column("last_renewed_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("tasks", sa.Column("cancelled_by", sa.String(length=256), nullable=True))
    for column in _TOTALS:
        op.add_column(
            "tasks", sa.Column(column, sa.BigInteger(), server_default="0", nullable=False)
        )
    op.add_column(
        "tasks", sa.Column("decision_count", sa.Integer(), server_default="0", nullable=False)
    )
    sums = ", ".join(
        f"{column} = (SELECT COALESCE(SUM(d.{source}), 0) FROM decisions AS d "
        "WHERE d.task_id = tasks.task_id)"
        for column, source in _TOTALS.items()
    )
    op.execute(
        f"UPDATE tasks SET {sums}, decision_count = (SELECT COUNT(*) FROM decisions AS d "
        "WHERE d.task_id = tasks.task_id)"
    )


def downgrade() -> None:
    # SQLite cannot drop a column in place on every version: batch mode copies the table there
    # (and is a plain ALTER TABLE on PostgreSQL).
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("decision_count")
        for column in reversed(list(_TOTALS)):
            batch.drop_column(column)
        batch.drop_column("cancelled_by")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("last_renewed_at")
        batch.drop_column("first_renewed_at")
        batch.drop_column("renewals")
    with op.batch_alter_table("lease_events") as batch:
        batch.drop_index("ix_lease_events_task_id_id")
    op.drop_table("lease_events")
