"""tasks: attempts whose assignment never reached a host (`unsent_attempts`)

An attempt is claimed (the task's attempt number raised) before its assignment is written to
the host's stream. When the stream was gone by then (a newer stream of the host took its place,
the replica was shutting down), the attempt was released at once but still counted against the
task's `max_attempts`: a task allowed one attempt failed without ever running. Such attempts
are counted here and left out of that limit.

Additive: one integer column, 0 for every existing task (server default), no index. Code from
before it runs against the new schema (it never names the column; inserts get the default).
The downgrade drops it.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tasks",
        sa.Column("unsent_attempts", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+), as in 0016 and 0018: a batch copy would lose 0015's
    # expression index on SQLite.
    op.drop_column("tasks", "unsent_attempts")
