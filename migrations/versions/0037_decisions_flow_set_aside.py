"""decisions: why a replay set its flow aside uncounted (`amc.v1.Decision.flow_set_aside`)

A replay that stops through no fault of its flow (the switch a step flips already where the
flow leaves it, the phone part-way through the flow) hands over without a divergence, and the
decision carried no flow: the step's record and the consoles said nothing of the flow being
set aside. `flow_set_aside` keeps why (with `flow_id` and `flow_step`); NULL on any other
decision.

Additive: one nullable column; rows from before it read as "not set aside", and code from
before it never names it. The downgrade drops it.

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0037"
down_revision: str | None = "0036"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("decisions", sa.Column("flow_set_aside", sa.Text(), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+), as in 0018 and 0035: a batch copy would lose 0015's
    # expression index on SQLite.
    op.drop_column("decisions", "flow_set_aside")
