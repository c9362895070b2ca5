"""dispatch_holds: the dispatch pauses every replica honours

A replica paused dispatch in memory when the model provider was down or refused the cloud's
key: every other replica on the same database handed out (and lost to a failing first step) a
task before it found out itself, and a restart forgot the pause and lost one more. The pause is
now a row, read by every replica each dispatch pass and at start.

Additive: a new table, empty at first (no pause, as after any start before it). Code from
before it never names it. The downgrade drops it.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dispatch_holds",
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("set_by", sa.String(length=64), nullable=False),
        sa.Column("next_probe_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("reason", name=op.f("pk_dispatch_holds")),
    )


def downgrade() -> None:
    op.drop_table("dispatch_holds")
