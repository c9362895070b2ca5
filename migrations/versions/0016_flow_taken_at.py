"""attempts: when the learning loop took an attempt (`flow_taken_at`)

The learning loop marks an ended attempt as taken ("working", then "counted"; "relooking" when
it looks again) while it learns from it. A replica killed mid-learn, or one whose closing mark
failed while the database was away, left the mark for good, and no replica looked at the
attempt again: its replay was never counted, its success never learned. The claim now stamps
when it took the attempt, and a mark older than `cloud.store.flows.RECLAIM_AFTER` is taken
back by any replica's loop (a conditional UPDATE: one replica wins). No existing timestamp
fits: `progress_updated_at` and the renewal columns say what the host did, and operators read
them.

Additive: one nullable column, no index (a claim finds stale marks through
`ix_attempts_flow_state`); a mark with no stamp (left before this migration) counts as stale.
Code from before it runs against the new schema (it never names the column); code from this
revision on needs it. The downgrade drops it.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("attempts", sa.Column("flow_taken_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+): a batch copy of the table would reflect it, and
    # SQLite's reflection leaves expression indexes out (0015's `ix_tasks_queue`).
    op.drop_column("attempts", "flow_taken_at")
