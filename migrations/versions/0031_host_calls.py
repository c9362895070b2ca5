"""host_calls: the calls a direct host shipped as of unknown cost or settled, once each

A host on the direct transport ships a call of unknown cost (ShippedUnsettledCall) and later the
failed_calls record that settles it (`settles_calls`). The record settled the call by deleting
its marker, which left no trace that the call was known: a resend of the unsettled call arriving
after the record (out of order, after a reconnect) was recorded again, "cost unknown" beside its
cost counted. A row per host call now says it was taken, and when it was settled.

Additive: a new table, empty; code from before it never names it. Calls settled before it have
no row (their resend is recorded again, as before). The downgrade drops it.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "host_calls",
        sa.Column("call_id", sa.String(length=32), nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=False),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("call_id", name=op.f("pk_host_calls")),
    )
    op.create_index("ix_host_calls_task_id", "host_calls", ["task_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_host_calls_task_id", table_name="host_calls")
    op.drop_table("host_calls")
