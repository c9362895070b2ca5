"""decisions.cost_usd, tasks.cost_usd, tasks.max_tokens and tasks.max_cost_usd: what a
decision cost, what a task's decisions cost together (its totals, beside the token totals of
0011), and caps

Additive: four columns with server defaults of 0 (a decision logged before this costs 0, a
task submitted before it has no cap and has spent $0); the downgrade drops them.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "decisions", sa.Column("cost_usd", sa.Float(), server_default="0", nullable=False)
    )
    op.add_column(
        "tasks", sa.Column("max_tokens", sa.BigInteger(), server_default="0", nullable=False)
    )
    op.add_column(
        "tasks", sa.Column("max_cost_usd", sa.Float(), server_default="0", nullable=False)
    )
    op.add_column("tasks", sa.Column("cost_usd", sa.Float(), server_default="0", nullable=False))


def downgrade() -> None:
    # SQLite cannot drop a column in place on every version: batch mode copies the table there
    # (and is a plain ALTER TABLE on PostgreSQL).
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("cost_usd")
        batch.drop_column("max_cost_usd")
        batch.drop_column("max_tokens")
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("cost_usd")
