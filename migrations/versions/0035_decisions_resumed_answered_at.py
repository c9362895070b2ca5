"""decisions: when the kept answer a resumed decision went on from was answered
(`amc.v1.ResumedTurn.answered_at`)

A decision resumed from a kept model answer (0033) said which answer, not when it was given:
the decision may come an attempt later, after a restart, and an auditor reading its rationale
could not tell how old it was. `resumed_answered_at` is when the planner's session store kept
the answer (NULL: the store did not say, any other decision).

Additive: one nullable column; rows from before it read as "not known", and code from before
it never names it. The downgrade drops it.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0035"
down_revision: str | None = "0034"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "decisions", sa.Column("resumed_answered_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+), as in 0018 and 0033: a batch copy would lose 0015's
    # expression index on SQLite.
    op.drop_column("decisions", "resumed_answered_at")
