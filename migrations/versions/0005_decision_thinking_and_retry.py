"""decisions: which thinking kind, which retry, whether the answer was cut off

Additive: three columns with server defaults, so rows written before them read "" (not
recorded: the API says UNSPECIFIED) and false; the downgrade drops them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-14
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "decisions",
        sa.Column("thinking_kind", sa.String(length=16), server_default="", nullable=False),
    )
    op.add_column(
        "decisions",
        sa.Column("retry_kind", sa.String(length=16), server_default="", nullable=False),
    )
    op.add_column(
        "decisions",
        sa.Column("output_truncated", sa.Boolean(), server_default=sa.false(), nullable=False),
    )


def downgrade() -> None:
    # SQLite cannot drop a column in place on every version: batch mode copies the table there
    # (and is a plain ALTER TABLE on PostgreSQL).
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("output_truncated")
        batch.drop_column("retry_kind")
        batch.drop_column("thinking_kind")
