"""typed planning: what each decision saw and what became of it; the host's step limit

Additive. `decisions` gains the page the decision was made on, the label of the element its
action names, and the outcome the host reported with its next Decide call (executed, error,
driver output; NULL until reported) — the cloud builds an attempt's history from these instead
of trusting a host-built prompt. `attempts` gains `max_steps` (Progress.max_steps, NULL when the
host did not say). Rows written before read as "no page, outcome unknown". The downgrade drops
the columns.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DECISION_COLUMNS = ("page", "target", "outcome_executed", "outcome_error", "outcome_driver_output")


def upgrade() -> None:
    op.add_column("decisions", sa.Column("page", sa.Text(), server_default="", nullable=False))
    op.add_column("decisions", sa.Column("target", sa.Text(), nullable=True))
    op.add_column("decisions", sa.Column("outcome_executed", sa.Boolean(), nullable=True))
    op.add_column("decisions", sa.Column("outcome_error", sa.Text(), nullable=True))
    op.add_column("decisions", sa.Column("outcome_driver_output", sa.Text(), nullable=True))
    op.add_column("attempts", sa.Column("max_steps", sa.Integer(), nullable=True))


def downgrade() -> None:
    # SQLite cannot drop a column in place on every version: batch mode copies the table there
    # (and is a plain ALTER TABLE on PostgreSQL).
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("max_steps")
    with op.batch_alter_table("decisions") as batch:
        for name in reversed(DECISION_COLUMNS):
            batch.drop_column(name)
