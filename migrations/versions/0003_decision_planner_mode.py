"""decisions.planner_mode: which planning mode made each decision

Additive: one column with a server default, so rows written before it read "compact" (the only
mode there was); the downgrade drops it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "decisions",
        sa.Column("planner_mode", sa.String(length=16), server_default="compact", nullable=False),
    )


def downgrade() -> None:
    # SQLite cannot drop a column in place on every version: batch mode copies the table there
    # (and is a plain ALTER TABLE on PostgreSQL).
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("planner_mode")
