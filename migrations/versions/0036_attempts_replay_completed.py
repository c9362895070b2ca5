"""attempts: whether a direct-transport host's replay ran to the flow's end
(`amc.v1.FlowReplayReport.completed`)

The learning loop took a direct attempt that succeeded with steps replayed and no divergence
for a replay that ran to its end: one stopped without a divergence (a switch already set, a
flow withdrawn mid-replay) and finished by the model was counted as a completed replay, reset
the flow's run of divergences, and its run was never learned from. The host now says so, and
`replay_completed` keeps it (NULL: not said, the cloud transport or an older host, whose replay
is inferred as before).

Additive: one nullable column; rows from before it read as "not said", and code from before it
never names it. The downgrade drops it.

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0036"
down_revision: str | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("attempts", sa.Column("replay_completed", sa.Boolean(), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+), as in 0018 and 0035: a batch copy would lose 0015's
    # expression index on SQLite.
    op.drop_column("attempts", "replay_completed")
