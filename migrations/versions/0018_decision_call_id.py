"""decisions: the conversation's id of a session decision's tool call (`call_id`)

In session mode the model's turn (its tool call) is kept in the conversation before the
decision is logged. When the decision was then lost (the replica died, the host's call was
cancelled), the retry could not tell which call the host had executed: it answered the newest
open call with the reported outcome, so the model heard that its lost call did what the one
before it did. With each logged decision's call id here, an outcome answers the call of the
decision it names, and a call no logged decision carries is answered as not carried out.

Additive: one nullable column, no index (it is read with the attempt's other steps, found by
their (task, attempt, step index) key). NULL for compact and replayed decisions,
shipped ones and rows from before this migration. Code from before it runs against the new
schema (it never names the column). The downgrade drops it.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("decisions", sa.Column("call_id", sa.Text(), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+), as in 0016: a batch copy would lose 0015's
    # expression index on SQLite.
    op.drop_column("decisions", "call_id")
