"""decisions: the kept model answer a decision went on from (`amc.v1.Decision.resumed_from`)

A decision may go on from an answer an earlier decision of the same step received, kept and
was billed for, then failed on a write after it, instead of asking the model again. Its
rationale and thinking are that answer's; until now the log did not say so, and an auditor
took them for a reply to the decision's own request. `resumed_position` is where the answer
begins in the attempt's conversation (NULL: any other decision), `resumed_turn_id` the
provider's id of it ("" when the provider sent none).

Additive: two nullable columns; rows from before it read as decisions that called the model,
and code from before it never names them. The downgrade drops them.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("decisions", sa.Column("resumed_position", sa.Integer(), nullable=True))
    op.add_column("decisions", sa.Column("resumed_turn_id", sa.Text(), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+), as in 0018: a batch copy would lose 0015's
    # expression index on SQLite.
    op.drop_column("decisions", "resumed_turn_id")
    op.drop_column("decisions", "resumed_position")
