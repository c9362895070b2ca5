"""attempts: the live-expiry index becomes a partial index of live attempts' expiries

`ix_attempts_live_expiry` was (ended_at, lease_expires_at). SQLite's planner, which has no
statistics, took `ended_at IS NULL` to that index for any query on live attempts and so walked
every live attempt of the fleet even when the query named a few tasks or hosts: the renewal
batch's read, the check after its write and the dispatcher's busy phones (23 us per renewal at
2,000 live leases, growing with the fleet). As `(lease_expires_at) WHERE ended_at IS NULL` it
serves what it is for (the expiry sweep, the outage grace's walk of live leases) from the live
rows alone, on both backends, and a query naming tasks or hosts uses their own indexes.

Schema-compatible (no column changes; code of either side of it runs against either index).
Building the partial index reads the table once and indexes only live attempts. The downgrade
restores the two-column index.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LIVE = sa.text("ended_at IS NULL")


def upgrade() -> None:
    op.drop_index("ix_attempts_live_expiry", table_name="attempts")
    op.create_index(
        "ix_attempts_live_expiry",
        "attempts",
        ["lease_expires_at"],
        sqlite_where=_LIVE,
        postgresql_where=_LIVE,
    )


def downgrade() -> None:
    op.drop_index("ix_attempts_live_expiry", table_name="attempts")
    op.create_index("ix_attempts_live_expiry", "attempts", ["ended_at", "lease_expires_at"])
