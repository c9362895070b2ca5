"""resilience: Decide step keys, late results, encrypted task secrets

Additive. `decisions.step_key` (NULL for rows written before, and for calls without a key)
with a unique constraint on (task_id, attempt, step_key): a retried Decide finds the decision it
already made instead of planning twice (NULLs never collide, on either backend).
`attempts.late_result` (false for old rows): the host's result arrived after the lease ran out
and was accepted. `task_secrets`: a task's secret parameters as Fernet tokens, deleted with the
task. The downgrade drops all three.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # SQLite adds a constraint by copying the table (batch mode); PostgreSQL alters in place.
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("step_key", sa.String(length=64), nullable=True))
        batch.create_unique_constraint(
            op.f("uq_decisions_step_key"), ["task_id", "attempt", "step_key"]
        )
    op.add_column(
        "attempts",
        sa.Column("late_result", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.create_table(
        "task_secrets",
        sa.Column("task_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.task_id"],
            name=op.f("fk_task_secrets_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("task_id", "name", name=op.f("pk_task_secrets")),
    )


def downgrade() -> None:
    op.drop_table("task_secrets")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("late_result")
    with op.batch_alter_table("decisions") as batch:
        batch.drop_constraint(op.f("uq_decisions_step_key"), type_="unique")
        batch.drop_column("step_key")
