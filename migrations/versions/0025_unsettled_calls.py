"""unsettled_calls: model calls started whose cost is not recorded yet (decision 0080)

A cloud killed (SIGKILL, OOM) or stopped past its grace while a model call was under way lost
that call's cost without a trace: the provider billed it, the task's totals and the day's
spending never saw it. A row is now written before each call and deleted in the transaction
that records what the provider reported of it; a row left over says "spend unknown, at most …".

Additive: a new table, empty; code from before it never names it. The downgrade drops it
(losing only the markers of calls already lost).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "unsettled_calls",
        sa.Column("call_id", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.String(length=128), nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("at_most_input_tokens", sa.Integer(), nullable=False),
        sa.Column("at_most_output_tokens", sa.Integer(), nullable=False),
        sa.Column("at_most_cost_usd", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("call_id", name=op.f("pk_unsettled_calls")),
    )
    op.create_index(
        "ix_unsettled_calls_task_id", "unsettled_calls", ["task_id", "attempt"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_unsettled_calls_task_id", table_name="unsettled_calls")
    op.drop_table("unsettled_calls")
