"""decisions: the screen each decision was made on (its observation, OCR left out)

Additive: one nullable column, so rows written before it have no screen (an export then says
so); the downgrade drops it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("decisions", sa.Column("observation_pb", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    # Batch mode: SQLite copies the table (a plain ALTER TABLE on PostgreSQL).
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("observation_pb")
