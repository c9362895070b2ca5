"""replicas: each replica vouches for its host streams with one row, not one per host

A replica's host heartbeat wrote `hosts.stream_alive_at` of every host whose stream it held,
and `last_seen_at` of every host that spoke since the beat before (at one renewal a second:
every host), each beat: O(connected hosts) rows a beat. A replica now writes its own row here
(`vouched_at`), and a host row that names it counts as connected while that row is fresh.

Additive: a new table, empty; code from before it never names it. A replica from before it
still vouches per host (`stream_alive_at`), which the new code also counts, so the two run
side by side during a rolling upgrade (the old one's fleet view counts the new one's hosts as
connected for three heartbeats after their hello only). The downgrade drops it.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("replica_id", sa.String(length=64), nullable=False),
        sa.Column("vouched_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("replica_id", name=op.f("pk_replicas")),
    )


def downgrade() -> None:
    op.drop_table("replicas")
